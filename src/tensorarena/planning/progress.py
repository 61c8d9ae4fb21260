"""Progress of a planner while it runs: a frozen record, and the throttle that sends it.

:func:`~tensorarena.planning.plan` and :func:`~tensorarena.planning.solve_exact` take
``progress=callback``; the callback receives a :class:`Progress` after the heuristics, at every
better plan, at every capacity the exact search settles, and at most every
:data:`TICK_SECONDS` while a search runs (from the search's own clock checks, so a callback costs
nothing between them). The callback runs on the planner's thread; an exception it raises stops
the planner and propagates, which is how a caller cancels.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TICK_SECONDS", "Progress", "ProgressCallback", "Reporter"]

#: Least seconds between two reports that only say "still searching".
TICK_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a planner stands: its best plan so far against the best lower bound it knows."""

    #: ``"heuristics"``, ``"long_lived_first"``, ``"band_repair"``, ``"exact"`` (searching),
    #: ``"done"``
    stage: str
    height: int | None  #: height of the best plan found so far (None: none yet)
    bound: int  #: no plan is lower (alignment-aware, raised by every infeasibility proof)
    seconds: float  #: since the planner started
    nodes: int  #: exact-search nodes visited so far

    @property
    def gap(self) -> float:
        """``(height - bound) / bound``; ``inf`` with no plan yet."""
        if self.height is None:
            return float("inf")
        if self.height <= self.bound:
            return 0.0
        return (self.height - self.bound) / self.bound if self.bound else float("inf")


ProgressCallback = Callable[[Progress], None]


class Reporter:
    """Sends :class:`Progress` to a callback: every change at once, ticks at most so often."""

    __slots__ = ("_callback", "_last", "_started", "bound", "height", "nodes")

    def __init__(self, callback: ProgressCallback | None, started: float, *, bound: int = 0,
                 height: int | None = None) -> None:
        self._callback = callback
        self._started = started
        self._last = 0.0
        self.bound = bound
        self.height = height
        self.nodes = 0

    def __bool__(self) -> bool:
        return self._callback is not None

    def update(self, stage: str, *, height: int | None = None, bound: int | None = None,
               nodes: int | None = None, tick: bool = False) -> None:
        """Record what changed; report it (a mere ``tick`` only if the last report is old)."""
        if height is not None and (self.height is None or height < self.height):
            self.height = height
        if bound is not None and bound > self.bound:
            self.bound = bound
        if nodes is not None:
            self.nodes = nodes
        if self._callback is None:
            return
        now = time.perf_counter()
        if tick and now - self._last < TICK_SECONDS:
            return
        self._last = now
        self._callback(Progress(stage, self.height, self.bound, now - self._started, self.nodes))
