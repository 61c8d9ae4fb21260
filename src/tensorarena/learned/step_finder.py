"""Step boundaries without markers: the period of the allocations, found and then followed.

:class:`StepFinder` feeds every allocation to a
:class:`~tensorarena.learned.period.PeriodDetector` and keeps a running
:class:`~tensorarena.learned.recording.Recorder` of them (the *history*), so that when a period
is found the last whole period before its boundary can be planned at once, from what was
already seen: a trace of five steps is served from its third. From then on a boundary falls
every ``period`` allocations.

A period is given up when the steps it cuts are served less than half from a plan
``lose_after`` times in a row (one step to notice a difference, one to re-learn from, one to
fail again); the detector never offers that length again and goes on from the history it kept.
The history is bounded: at ``4 * max_period`` allocations it starts again (its numbers then
move, which is why a block remembers the *epoch* it was logged in).
"""

from __future__ import annotations

from typing import NamedTuple

from tensorarena.learned.period import Period, PeriodDetector
from tensorarena.learned.recording import Recorder, StepRecording

__all__ = ["Found", "StepFinder"]


class Found(NamedTuple):
    """A period just found: the last whole step seen, and whether the next step begins with
    the allocation being made (else it began earlier, unplanned, and ends at the boundary)."""

    recording: StepRecording
    begins_now: bool


class StepFinder:
    """Where the steps of an unmarked allocation sequence begin (see the module docstring)."""

    def __init__(self, detector: PeriodDetector, *, lose_after: int = 3) -> None:
        detector.reset()
        self._detector = detector
        self._history = Recorder()
        self.epoch = 0  #: how many times the history started again
        self.period: Period | None = None
        self._boundary = 0  # the history number of the next step's first allocation
        self._partial = False  # the step in progress began before the period was known
        self._bad = 0
        self._lose_after = lose_after

    @property
    def max_period(self) -> int:
        """The longest step sought, in allocations."""
        return self._detector.max_period

    def at_boundary(self) -> bool | None:
        """Before an allocation: ``None`` if it does not begin a step; else whether the step
        that ends here is to be learned from (not when it began before the period was known)."""
        if self.period is None or len(self._history) != self._boundary:
            return None
        self._boundary += self.period.length
        partial, self._partial = self._partial, False
        return not partial

    def observe(self, nbytes: int, live_bytes: int) -> Found | None:
        """Take the allocation about to be made (after :meth:`at_boundary`)."""
        detector = self._detector
        if len(self._history) >= 4 * detector.max_period:  # bound what is kept
            self._boundary -= len(self._history)
            self._history = Recorder()
            self.epoch += 1
            detector.reset()
        index = len(self._history)
        found = detector.observe(nbytes, live_bytes, evaluate=self.period is None)
        if found is None or self.period is not None:
            return None
        # Plan the last whole period before the boundary in the last period seen; serve from
        # the next boundary (now, if this allocation is one).
        boundary = found.next_boundary(index - found.length + 1)
        history = self._history
        until = history.start_of(boundary) if boundary < index else history.clock
        recording = history.finish(boundary - found.length, boundary, until)
        self.period = found
        self._bad = 0
        self._boundary = boundary + found.length
        self._partial = boundary != index
        if not self._partial:
            self._boundary = index + found.length
        return Found(recording, not self._partial)

    def log(self, nbytes: int, alignment: int) -> int:
        """Log the allocation in the history; return its number (in :attr:`epoch`)."""
        return self._history.allocated(nbytes, alignment)

    def freed(self, epoch: int, number: int) -> None:
        """Log the free of an allocation the history holds (another epoch's is forgotten)."""
        if epoch == self.epoch:
            self._history.freed(number)

    def step_ended(self, served: int, allocations: int) -> bool:
        """A step under the period ended, ``served`` of its ``allocations`` from a plan;
        True if the period is given up (the plans made for its steps are worthless)."""
        if self.period is None:
            return False
        self._bad = self._bad + 1 if served * 2 < allocations else 0
        if self._bad < self._lose_after:
            return False
        self._detector.reject(self.period.length)
        self.period = None
        self._partial = False
        self._bad = 0
        return True
