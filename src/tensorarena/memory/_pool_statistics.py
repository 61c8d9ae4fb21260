"""A pool's counters, reported and checked: ``statistics()``, arena snapshots, peaks, invariants.

:class:`PoolStatistics` is the half of :class:`~tensorarena.memory.pool.Pool` that reads its
bookkeeping rather than changing placement; ``Pool`` inherits it (a mixin, not a wrapper).
``Pool.__init__`` sets the counters named in the class body; ``allocate``/``deallocate`` and
:class:`~tensorarena.memory._pool_arenas.PoolArenas` keep them.

The counters speak :mod:`tensorarena.stats`: *requested* = bytes callers asked for;
*allocated* (= *active*) = the bytes live blocks occupy (requests rounded up to their
alignment); *reserved* = bytes held from the upstream, live or not. Each is kept as current,
peak and total, so a report is O(arenas) (the free-space figures are the arenas' own).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tensorarena.core.arena import Arena
from tensorarena.debug import CHEAP, EXPENSIVE, check
from tensorarena.stats import ArenaStatistics, Count, MemoryStatistics

__all__ = ["ArenaSnapshot", "PoolStatistics"]


@dataclass(frozen=True, slots=True)
class ArenaSnapshot:
    """One arena of a pool, as it was when :attr:`Pool.arenas` was read."""

    base: int  #: address of the arena's first byte
    capacity: int
    strategy: str
    statistics: ArenaStatistics


class PoolStatistics:
    """Reporting and checking a pool's counters (:class:`~tensorarena.memory.pool.Pool`
    inherits it)."""

    # The pool's state this half reads (and whose peaks it resets); Pool.__init__ sets it.
    _lock: threading.RLock
    _maximum: int | None
    _arenas: list[Arena]
    _blocks: dict[int, tuple[Arena, int]]  # live address -> (arena, rounded bytes)
    _requested: int
    _peak_requested: int
    _total_requested: int
    _allocated: int
    _peak_allocated: int
    _total_allocated: int
    _reserved: int
    _peak_reserved: int
    _total_reserved: int
    _peak_blocks: int
    _total_blocks: int
    _peak_arenas: int
    _upstream_allocs: int
    _upstream_frees: int
    _retries: int
    _ooms: int

    @property
    def arenas(self) -> tuple[ArenaSnapshot, ...]:
        """A snapshot of every arena, in creation order (the order requests try them)."""
        with self._lock:
            return tuple(
                ArenaSnapshot(a.base, a.capacity, a.strategy_name, a.statistics())
                for a in self._arenas
            )

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot in the vocabulary of :mod:`tensorarena.stats` (O(arenas))."""
        with self._lock:
            free = largest = extents = split = 0
            for arena in self._arenas:
                stats = arena.statistics()
                free += stats.free_bytes
                largest = max(largest, stats.largest_free_bytes)
                extents += stats.free_extents
                split += stats.inactive_split_bytes
            allocated = Count(self._allocated, self._peak_allocated, self._total_allocated)
            live, arenas = len(self._blocks), len(self._arenas)
            return MemoryStatistics(
                requested_bytes=Count(
                    self._requested, self._peak_requested, self._total_requested
                ),
                allocated_bytes=allocated,
                active_bytes=allocated,
                reserved_bytes=Count(self._reserved, self._peak_reserved, self._total_reserved),
                allocations=Count(live, self._peak_blocks, self._total_blocks),
                segments=Count(arenas, self._peak_arenas, self._upstream_allocs),
                inactive_split_bytes=split,
                free_bytes=free,
                largest_free_bytes=largest,
                free_extents=extents,
                num_alloc_retries=self._retries,
                num_ooms=self._ooms,
                num_upstream_allocs=self._upstream_allocs,
                num_upstream_frees=self._upstream_frees,
                limit=self._maximum,
            )

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value (``torch.cuda.reset_peak_memory_stats``)."""
        with self._lock:
            self._peak_requested = self._requested
            self._peak_allocated = self._allocated
            self._peak_reserved = self._reserved
            self._peak_blocks = len(self._blocks)
            self._peak_arenas = len(self._arenas)
            for arena in self._arenas:
                arena.reset_peak_stats()

    def _check_invariants(self, level: int = EXPENSIVE) -> None:
        """Check the invariants of ``level`` (cheap: counters; expensive: every arena's and
        every block's); raise :class:`~tensorarena.errors.InvariantError` if one is broken."""
        if level < CHEAP:
            return
        check(self._reserved == sum(a.capacity for a in self._arenas), "reserved bytes drift")
        check(0 <= self._requested <= self._allocated, "requested exceeds allocated bytes")
        check(self._allocated <= self._reserved, "allocated exceeds reserved bytes")
        if self._maximum is not None:
            check(self._reserved <= self._maximum, "reserved bytes exceed maximum_size")
        if level < EXPENSIVE:
            return
        for arena in self._arenas:
            arena._check_invariants(EXPENSIVE)
        bases = sorted((a.base, a.capacity) for a in self._arenas)
        previous_end = 0
        for base, capacity in bases:
            check(base >= previous_end, f"arenas overlap at {base:#x}")
            previous_end = base + capacity
        check(len(self._blocks) == sum(len(a) for a in self._arenas), "live block count drift")
        check(self._requested == sum(a.requested for a in self._arenas), "requested bytes drift")
        check(
            self._allocated == sum(rounded for _, rounded in self._blocks.values()),
            "allocated bytes drift",
        )
        arenas = set(map(id, self._arenas))
        for address, (arena, _) in self._blocks.items():
            check(id(arena) in arenas, f"block {address:#x} belongs to an arena given back")
            check(arena.is_live(address), f"block {address:#x} is not live in its arena")
