"""One step's allocations as recorded: sizes, alignments, order and lifetimes.

A :class:`Recorder` keeps a logical clock that ticks once per allocation and once per free of a
block allocated in the same recording, so lifetimes are half-open ``[start, end)`` on that clock
(the convention of :mod:`tensorarena.planning.problem`): a block freed at tick ``t`` may share
bytes with one allocated at tick ``t + 1``. A block still live when the recording ends has no
``end``: it *outlived* its step and is left out of the plan (its bytes stay with the dynamic
pool, which can hold them for as long as the caller wants).

:meth:`Recorder.finish` freezes a window of the recording into a :class:`StepRecording`, the
plain data a plan is made from. The window is the whole recording at a step marker, or, when the
steps are found without markers, one period of it (``first``/``last`` allocation index and the
clock at which the window ends).

At a step marker the recorder is frozen into a :class:`FinishedStep`: its signature (what a
step that repeats its plan is compared by, made with no Python call per allocation, or compared
in C++ for a native log: :mod:`~tensorarena.learned.native_recorder`), its
:class:`StepRecording` only when a plan is learned from it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import is_
from typing import NamedTuple

from tensorarena.planning.problem import Buffer, Problem

__all__ = ["FinishedStep", "RecordedAllocation", "Recorder", "Signature", "StepRecording"]

#: A step's sizes in order, and the positions of its allocations that outlived it.
Signature = tuple[tuple[int, ...], tuple[int, ...]]


class RecordedAllocation(NamedTuple):
    """One allocation of a step: live during ``[start, end)`` on the step's clock; ``end`` is
    ``None`` when the block outlived the step. (A named tuple, not a frozen dataclass: a step
    makes one per allocation at its marker, and a frozen dataclass is several times dearer to
    make, a visible part of a small model's step.)"""

    nbytes: int
    alignment: int
    start: int
    end: int | None

    @property
    def outlived(self) -> bool:
        """True if the block was still live when its step ended."""
        return self.end is None


@dataclass(frozen=True, slots=True)
class StepRecording:
    """The allocations of one step, in the order they were made, over ``ticks`` ticks."""

    allocations: tuple[RecordedAllocation, ...]
    ticks: int = 0

    def __len__(self) -> int:
        return len(self.allocations)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every allocation's size, in order: the step's signature."""
        return tuple(a.nbytes for a in self.allocations)

    def signature(self) -> Signature:
        """Sizes and which allocations outlived the step: two recordings with the same
        signature give the same slots."""
        return self.sizes, tuple(i for i, a in enumerate(self.allocations) if a.end is None)

    def key(self, length: int) -> tuple[int, ...]:
        """The sizes of the first ``length`` allocations: what a plan is looked up by."""
        return tuple(a.nbytes for a in self.allocations[:length])

    def rotated(self, carried: Collection[int], cut: int) -> StepRecording:
        """The step seen from a cut after its blocks *carried* into the next step are freed,
        so that those blocks fit inside one step.

        ``carried`` are the positions of allocations that outlived this step and were freed in
        the next one, the last of them after the next step's first ``cut`` allocations. A
        training step makes its gradients in the backward pass and the next step's
        ``zero_grad`` frees them: cut at the marker, every gradient outlives its step and has
        no slot. Cut before allocation ``cut`` instead (a repeating step looks the same from
        any point), the window from there to the end of this step, followed by the next step's
        first ``cut`` allocations (this step's stand for them), holds each gradient from its
        birth to the window's end. Positions are kept (a step is still matched from its
        marker); lifetimes move to the window's clock. A carried block is taken to live to the
        window's end, a little longer than it does: safe, and exact when the frees come first.
        A block that would not fit in the window (live across the cut in its own step, or
        carried but made before the cut) outlives it.
        """
        length = self.ticks
        allocations = self.allocations
        at = allocations[cut].start if cut < len(allocations) else length
        rotated = []
        for i, a in enumerate(allocations):
            end = a.end if a.end is not None else (length + at if i in carried else None)
            shift = -at if i >= cut else length - at
            inside = end is not None and end + shift <= length
            rotated.append(RecordedAllocation(
                a.nbytes, a.alignment, a.start + shift,
                end + shift if inside and end is not None else None))
        return StepRecording(tuple(rotated), length)

    def held(self, carried: Collection[int]) -> StepRecording:
        """The step with its blocks *carried* into the next step (``carried``: their positions)
        held for the whole window, so that they get slots too without moving the cut.

        A block made at tick ``b`` and freed in the next step at tick ``c`` lives ``[b, end)``
        and again ``[0, c)`` on a repeating step's clock; the window holds it for all of
        ``[0, end)``: exact where nothing else lives beside it over ``[c, b)``, and safe
        wherever ``c <= b`` (the last copy is gone before the next is made in its slot; else
        the slot is occupied and the allocation falls back). Unlike a rotation, no other
        block lives across the window's ends.
        """
        length = self.ticks
        return StepRecording(tuple(
            RecordedAllocation(a.nbytes, a.alignment, 0, length) if i in carried else a
            for i, a in enumerate(self.allocations)), length)

    def problem(self) -> Problem:
        """The planning problem: one buffer per allocation that was freed within the step,
        named by its position in the step."""
        return Problem(
            (Buffer(str(i), a.start, a.end, a.nbytes, a.alignment)
             for i, a in enumerate(self.allocations) if a.end is not None),
            name="learned step",
        )


class Recorder:
    """The mutable log behind a recording (its owner holds the lock).

    Allocations are numbered from 0 in the order they are made; ``free`` takes that number.
    """

    __slots__ = ("_alignments", "_clock", "_ended", "_ends", "_sizes", "_starts")

    def __init__(self) -> None:
        self._sizes: list[int] = []
        self._alignments: list[int] = []
        self._starts: list[int] = []
        self._ends: list[int | None] = []
        self._clock = 0
        self._ended = False

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def clock(self) -> int:
        """The current tick."""
        return self._clock

    def allocated(self, nbytes: int, alignment: int) -> int:
        """Log an allocation; return its number."""
        self._sizes.append(nbytes)
        self._alignments.append(alignment)
        self._starts.append(self._clock)
        self._ends.append(None)
        self._clock += 1
        return len(self._sizes) - 1

    def freed(self, index: int) -> None:
        """Log the free of allocation ``index`` (nothing once the step ended, :meth:`end`: the
        block outlived it)."""
        if not self._ended:
            self._ends[index] = self._clock
            self._clock += 1

    def signature(self) -> Signature:
        """:meth:`StepRecording.signature` of :meth:`finish` ``()``, without making it (with
        no Python step per allocation: a step's marker compares this with its plan's)."""
        ends = self._ends
        return tuple(self._sizes), tuple(compress(count(), map(is_, ends, repeat(None))))

    def matches(self, signature: Signature) -> bool:
        """True if :meth:`signature` is ``signature``."""
        return self.signature() == signature

    def same(self, other: Recorder) -> bool:
        """True if the two recorders have one signature."""
        return self.signature() == other.signature()

    def start_of(self, index: int) -> int:
        """The tick at which allocation ``index`` was made."""
        return self._starts[index]

    def key(self, length: int) -> tuple[int, ...]:
        """The sizes of the first ``length`` allocations."""
        return tuple(self._sizes[:length])

    def end(self, *, learned: bool) -> None:
        """The step ended (``learned``: a plan may be learned from it): a free that comes later
        (while the marker is at work) is not logged, so that the step's recording and its
        signature agree that the block outlived it."""
        self._ended = True

    @classmethod
    def of_lists(cls, sizes: list[int], alignments: list[int], starts: list[int],
                 ends: list[int | None], clock: int) -> Recorder:
        """A recorder holding this log (the lists are taken, not copied)."""
        recorder = cls()
        recorder._sizes, recorder._alignments = sizes, alignments
        recorder._starts, recorder._ends, recorder._clock = starts, ends, clock
        return recorder

    def finish(self, first: int = 0, last: int | None = None,
               until: int | None = None) -> StepRecording:
        """Allocations ``first`` to ``last`` (exclusive; default: all) as a recording whose
        window ends at tick ``until`` (default: now); frees after it count as outliving it."""
        last = len(self._sizes) if last is None else last
        until = self._clock if until is None else until
        base = self._starts[first] if 0 < first < last else 0  # a window starts at its first
        make = tuple.__new__  # RecordedAllocation's fields, with no call of its __new__
        allocations = tuple([
            make(RecordedAllocation, (nbytes, alignment, start - base,
                                      None if end is None or end >= until else end - base))
            for nbytes, alignment, start, end in zip(
                self._sizes[first:last], self._alignments[first:last],
                self._starts[first:last], self._ends[first:last], strict=True)])
        return StepRecording(allocations, until - base)


class FinishedStep:
    """A step ended at a marker: its frozen recorder (nothing logs to it any more), its
    signature, and its recording, made the first time it is asked for.

    A step kept in a native log (:class:`~tensorarena.learned.native_recorder.NativeRecorder`)
    is compared with a signature or another step there, with no Python int per allocation: its
    :attr:`signature` is made only when asked for (a step that differs from its plan)."""

    __slots__ = ("_native", "_recorder", "_recording", "_signature")

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._recording: StepRecording | None = None
        self._native = type(recorder) is not Recorder
        self._signature = None if self._native else recorder.signature()

    def __len__(self) -> int:
        return len(self._recorder)

    @property
    def signature(self) -> Signature:
        """:meth:`StepRecording.signature` of :meth:`recording` (made once)."""
        if self._signature is None:
            self._signature = self._recorder.signature()
        return self._signature

    def has_signature(self, signature: Signature) -> bool:
        """True if this step's signature is ``signature``."""
        if self._signature is None:
            return self._recorder.matches(signature)
        return self._signature == signature

    def same_as(self, other: FinishedStep) -> bool:
        """True if the two steps have one signature."""
        if self._native and other._native and self._signature is None:
            return self._recorder.same(other._recorder)
        return self.has_signature(other.signature)

    def recording(self) -> StepRecording:
        """The whole recording (made once)."""
        if self._recording is None:
            self._recording = self._recorder.finish()
        return self._recording

    def key(self, length: int) -> tuple[int, ...]:
        """:meth:`StepRecording.key` of :meth:`recording`."""
        return self._recorder.key(length)
