"""Finding the steps of a repeating allocation sequence without markers.

A step of a training loop or of a fixed-shape server allocates the same sizes in the same order,
and the live set goes back to where it was when the step began. :class:`PeriodDetector` watches
one token per allocation, ``(nbytes, live bytes just before it)``, and reports a period ``p``
once the last ``2p`` tokens are two copies of the same ``p``: the sizes repeat *and* the live
set's level follows the same path. The level is what tells a whole step from a loop inside it:
the layers of a forward pass allocate the same sizes layer after layer, but the saved
activations raise the level each time, so their tokens never repeat; a warm-up prefix (a first
step that makes the optimizer's state) sits at another level and is skipped the same way.

A short loop whose every iteration allocates and frees the same scalars (a ping-pong of two
sizes at one level) repeats its tokens too. A period is therefore accepted when its lowest
level is also the lowest of the last ``max(3 * period, base_window)`` allocations (a whole step
returns to the base level, a loop inside a step runs above it), or when it has repeated three
times and for at least ``min_run`` allocations (a warm-up prefix that made lasting state, an
optimizer's, sits below the steady base: the level test alone would wait until the window
slides past it; a loop inside a step rarely runs three times at one level, and one that does
is rejected by the caller when the steps it cuts do not repeat). A period that its user found
wrong (:meth:`PeriodDetector.reject`: the steps it gave did not repeat) is not offered again.

Candidate periods come from earlier positions of the same token (the few most recent), and each
candidate keeps the length of its current run of matches, so a token costs a dictionary lookup
and one comparison per live candidate. The step boundary (the *phase*) is the position in the
last period where the live level is lowest, the earliest such: where a step's temporaries are
all freed.

Limits: a program whose live level drifts every step (it keeps one output per step) never
repeats a token and is not detected; use markers there. Detection needs two whole steps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tensorarena.errors import InvalidArgumentError

__all__ = ["Period", "PeriodDetector"]

#: Earlier positions of a token tried as the start of a period.
_RECENT = 4


@dataclass(frozen=True, slots=True)
class Period:
    """A period found at allocation ``found_at``: steps of ``length`` allocations; a step
    begins at every allocation index ``phase + k * length``."""

    length: int
    phase: int
    found_at: int

    def next_boundary(self, index: int) -> int:
        """The first step boundary at or after allocation ``index``."""
        return index + (self.phase - index) % self.length


class PeriodDetector:
    """Watches ``(nbytes, live_bytes)`` per allocation and finds the period, if any."""

    def __init__(self, *, min_period: int = 2, max_period: int = 1 << 20,
                 base_window: int = 1024, min_run: int = 64) -> None:
        if type(min_period) is not int or min_period < 1:
            raise InvalidArgumentError(f"min_period must be an int >= 1, got {min_period!r}")
        if type(max_period) is not int or max_period < min_period:
            raise InvalidArgumentError(
                f"max_period must be an int >= min_period ({min_period}), got {max_period!r}")
        if type(base_window) is not int or base_window < 0:
            raise InvalidArgumentError(f"base_window must be an int >= 0, got {base_window!r}")
        self.min_period = min_period
        self.max_period = max_period
        if type(min_run) is not int or min_run < 1:
            raise InvalidArgumentError(f"min_run must be an int >= 1, got {min_run!r}")
        self.base_window = base_window
        self.min_run = min_run
        self.reset()

    def reset(self) -> None:
        """Forget everything seen."""
        self._tokens: list[tuple[int, int]] = []
        self._levels: list[int] = []  # the live level of each token, for min() over a slice
        self._rejected: set[int] = set()
        self._seen: dict[tuple[int, int], deque[int]] = {}
        self._runs: dict[int, int] = {}  # candidate period -> matches in a row up to now
        self._offset = 0  # allocation index of self._tokens[0]

    def __len__(self) -> int:
        """Allocations observed since the last :meth:`reset`."""
        return len(self._tokens) + self._offset

    def reject(self, length: int) -> None:
        """Never offer a period of ``length`` again (until :meth:`reset`)."""
        self._rejected.add(length)
        self._runs.pop(length, None)

    def observe(self, nbytes: int, live_bytes: int, *, evaluate: bool = True) -> Period | None:
        """Take the next allocation; return the period once two whole periods repeat.

        ``evaluate=False`` only records the allocation (cheaper: a caller that already knows
        its period keeps the history going for when it loses it)."""
        tokens, runs = self._tokens, self._runs
        token = (nbytes, live_bytes)
        n = len(tokens)
        for p in list(runs):
            if tokens[n - p] == token:
                runs[p] += 1
            else:
                del runs[p]
        recent = self._seen.get(token)
        if recent is None:
            recent = self._seen[token] = deque(maxlen=_RECENT)
        for q in recent:
            p = n - q
            if (self.min_period <= p <= self.max_period and p not in runs
                    and p not in self._rejected):
                runs[p] = 1
        recent.append(n)
        tokens.append(token)
        levels = self._levels
        levels.append(live_bytes)
        if n >= 4 * self.max_period:
            self._forget_before(n - 2 * self.max_period)
            return None
        if not evaluate:
            return None
        for p in sorted(p for p, run in runs.items() if run >= p):
            n = len(tokens) - 1
            lowest = min(levels[n - p + 1:])
            if (runs[p] < max(self.min_run, 2 * p)
                    and lowest > min(levels[max(0, n - max(3 * p, self.base_window) + 1):])):
                continue  # a short loop above the base level, not a step
            phase = next(i for i in range(n - p + 1, n + 1) if levels[i] == lowest)
            return Period(p, (phase + self._offset) % p, n + self._offset)
        return None

    def _forget_before(self, keep_from: int) -> None:
        """Drop tokens before ``keep_from``: a period longer than ``max_period`` is not sought."""
        self._offset += keep_from
        self._tokens = self._tokens[keep_from:]
        self._levels = self._levels[keep_from:]
        self._seen = {}
        for i, token in enumerate(self._tokens):
            self._seen.setdefault(token, deque(maxlen=_RECENT)).append(i)
        self._runs = {}
