"""The counters of :class:`~tensorarena.learned.LearnedPlans` and the records made from them.

A mixin, as :mod:`tensorarena.memory._pool_statistics` is for the pool: the resource's module
keeps the calls, this one what is counted, reported and checked. Reserved bytes are what the
resource holds from its upstream (its arenas and its pool's), counted by a
:class:`~tensorarena.adaptors.Counting` over the upstream; the steady state's peak is that
meter's peak since the newest plan began to serve, the whole run's the highest of that and the
peaks before.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from tensorarena.adaptors.counting import Counting
from tensorarena.debug import check
from tensorarena.learned.fallback import SegregatedFallback
from tensorarena.learned.plan_cache import PlanCache
from tensorarena.learned.report import FallbackReason, LearnedPlansReport
from tensorarena.learned.step_finder import StepFinder
from tensorarena.stats import Count, MemoryStatistics

__all__ = ["LearnedStatistics"]


class LearnedStatistics:
    """``report()``, ``statistics()``, ``reset_peak_stats()`` and the invariant check."""

    _lock: threading.RLock
    _meter: Counting
    _pool: SegregatedFallback
    _plans: PlanCache
    _finder: StepFinder | None
    _blocks: dict[int, Any]
    _fallbacks: dict[FallbackReason, int]
    _live_bytes: int
    _peak_live: int
    _total_bytes: int
    _peak_blocks: int
    _allocations: int
    _served: int
    _out_of_order: int
    _steps: int
    _peak_before: int
    _steady: bool

    def report(self) -> LearnedPlansReport:
        """What happened so far: steps, plans, served and fallen back (by reason)."""
        with self._lock:
            held = self._meter.statistics().requested_bytes
            fallbacks = {reason.value: n for reason, n in self._fallbacks.items()}
            period = None if self._finder is None else self._finder.period
            return LearnedPlansReport(
                steps=self._steps, plans_learned=self._plans.learned,
                plans_evicted=self._plans.evicted, allocations=self._allocations,
                served=self._served, served_out_of_order=self._out_of_order,
                fell_back=sum(fallbacks.values()), **fallbacks, reserved_bytes=held.current,
                peak_reserved_bytes=max(held.peak, self._peak_before),
                steady_peak_reserved_bytes=held.peak if self._steady else None,
                arena_bytes=self._plans.arena_bytes,
                period=None if period is None else period.length,
                plans=self._plans.summaries())

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot in the vocabulary of :mod:`tensorarena.stats`: requested bytes
        are the callers' live blocks, reserved bytes what is held from the upstream."""
        with self._lock:
            held = self._meter.statistics()
            live = Count(self._live_bytes, self._peak_live, self._total_bytes)
            reserved = held.requested_bytes
            reserved = Count(reserved.current, max(reserved.peak, self._peak_before),
                             reserved.total)
            return MemoryStatistics(
                requested_bytes=live, allocated_bytes=live, active_bytes=live,
                reserved_bytes=reserved,
                allocations=Count(len(self._blocks), self._peak_blocks, self._allocations),
                segments=held.allocations,
                num_upstream_allocs=held.allocations.total,
                num_upstream_frees=held.allocations.freed)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value (``torch.cuda.reset_peak_memory_stats``): the
        whole run's and the steady state's peaks start again from here."""
        with self._lock:
            self._meter.reset_peak_stats()
            self._peak_before = 0
            self._peak_live = self._live_bytes
            self._peak_blocks = len(self._blocks)

    def _check_invariants(self) -> None:
        """Raise :class:`~tensorarena.errors.InvariantError` if a live block shares bytes with
        another, lies outside its arena, or the counts drift."""
        with self._lock:
            check(self._live_bytes == sum(b.nbytes for b in self._blocks.values()),
                  "live bytes drift")
            check(self._served + sum(self._fallbacks.values()) == self._allocations,
                  "served and fallen back do not add up")
            ranges = sorted((address, address + b.nbytes) for address, b in self._blocks.items())
            for (_, end), (start, _) in itertools.pairwise(ranges):
                check(end <= start, "two live blocks share bytes")
            for address, b in self._blocks.items():
                if b.plan is not None:
                    check(b.plan.base is not None and address == b.plan.base + b.offset
                          and b.offset + b.nbytes <= b.plan.height, "a block outside its arena")
            check(len(self._pool) == sum(b.plan is None for b in self._blocks.values()),
                  "pool blocks drift")
