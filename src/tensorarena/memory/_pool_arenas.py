"""A pool's arenas: growing by one when no arena can hold a request, giving empty ones back.

:class:`PoolArenas` is the half of :class:`~tensorarena.memory.pool.Pool` that talks to the
upstream; ``Pool`` inherits it (a mixin, not a wrapper: the allocate/deallocate hot path calls
nothing more than before). It reads and writes the pool's state named in its class body, which
``Pool.__init__`` sets.

Growth decides everything on bookkeeping first (the growth policy's size, ``maximum_size``, what
the strategy can place in a fresh arena), so that a request that fails anyway leaves the pool as
it was. At the cap, and when the upstream itself is out of memory, the empty arenas are given
back and the request retried once (what PyTorch's caching allocator does). An arena is forgotten
only once the upstream took it back: a failing ``deallocate`` leaves it in the pool.
"""

from __future__ import annotations

import contextlib

from tensorarena.core.arena import Arena, fresh_arena_fits
from tensorarena.core.strategy import StrategyFactory
from tensorarena.debug import OFF
from tensorarena.errors import InvalidAlignmentError, OutOfMemoryError
from tensorarena.memory.growth import GrowthPolicy
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.sizes import align_up, format_size

__all__ = ["PoolArenas", "release_arenas"]

#: Arena sizes are rounded up to this, so that every arena can serve default-aligned requests.
_ARENA_GRANULE = DEFAULT_ALIGNMENT
#: Arenas are asked to start on a page boundary at least, so that page-aligned requests fit in
#: any arena (an arena can honour no alignment above its base's).
_ARENA_ALIGNMENT = 4096


def release_arenas(upstream: MemoryResource, arenas: list[Arena]) -> None:
    """Give every arena back to ``upstream``, ignoring errors (a garbage-collected pool's
    finalizer: nobody to report to)."""
    for arena in arenas:
        with contextlib.suppress(Exception):
            upstream.deallocate(arena.base, arena.capacity, None)
    arenas.clear()


class PoolArenas:
    """Growing and trimming a pool's arenas (:class:`~tensorarena.memory.pool.Pool` inherits
    it)."""

    # The pool's state this half uses; Pool.__init__ sets every one.
    _upstream: MemoryResource
    _factory: StrategyFactory
    _strategy_name: str
    _growth: GrowthPolicy
    _initial: int
    _maximum: int | None
    _arenas: list[Arena]  # in creation order: the order requests try them
    _requested: int  # for the out-of-memory error
    _reserved: int
    _peak_reserved: int
    _total_reserved: int
    _peak_arenas: int
    _upstream_allocs: int
    _upstream_frees: int
    _retries: int
    _ooms: int

    def _grow(self, nbytes: int, alignment: int, stream: Stream) -> Arena:
        """Add an arena that can hold ``nbytes`` at ``alignment``, or raise, unchanged."""
        rounded = (nbytes + alignment - 1) & -alignment
        # Where the alignment is what cannot be met, the message says so (as an Arena's does).
        aligned = "" if rounded == nbytes else (
            f"; alignment {alignment} rounds the request up to {rounded} bytes")
        wanted = self._growth.next_size(rounded, self._reserved)
        if self._reserved == 0:
            # An empty pool (new, or trimmed) starts again from its initial size.
            wanted = max(wanted or 0, self._initial, rounded)
        if wanted is None:
            misaligned = any(not arena.honours(alignment) for arena in self._arenas)
            why = f"no arena base is aligned to {alignment}" if misaligned else (
                "no arena can hold it"
            )
            raise self._out_of_memory(
                nbytes, f"{why} and the growth policy {self._growth!r} refuses to add one{aligned}"
            )
        # Decide everything on bookkeeping first, so that a request that fails anyway leaves
        # the pool as it was: the size within maximum_size, else within it once the empty
        # arenas are given back (what PyTorch's caching allocator does at its limit).
        headroom = None if self._maximum is None else self._maximum - self._reserved
        size = self._arena_size(max(wanted, rounded), nbytes, alignment, limit=headroom)
        trim_first = False
        if size is None and headroom is not None:
            empty = sum(arena.capacity for arena in self._arenas if not len(arena))
            if empty:
                size = self._arena_size(
                    max(wanted, rounded), nbytes, alignment, limit=headroom + empty
                )
                trim_first = size is not None
            if size is None and rounded > headroom + empty:
                raise self._out_of_memory(
                    nbytes,
                    f"a new arena of {format_size(rounded)} would exceed maximum_size "
                    f"{format_size(self._maximum or 0)} (headroom {format_size(headroom)}"
                    + (f", {format_size(empty)} more in empty arenas)" if empty else ")")
                    + aligned,
                )
        if size is None:
            raise self._out_of_memory(
                nbytes,
                f"the {self._strategy_name} strategy cannot place {format_size(rounded)} in an "
                f"arena of {format_size(max(wanted, rounded))}"
                + ("" if headroom is None else " within maximum_size") + aligned,
            )
        if trim_first:  # maximum_size needs the empty arenas' room
            return self._add_after_giving_back(size, alignment, stream, requested=nbytes)
        # A growth policy's ``release_outgrown``: the empty arenas too small for this request (a
        # large block that grew, a re-planned arena, a larger output tail) go back once the new
        # one is taken, instead of staying mapped and resident beside it; never before, so a
        # pool that raises is unchanged.
        replaced = ([a for a in self._arenas if not len(a) and a.capacity < rounded]
                    if getattr(self._growth, "release_outgrown", False) else [])
        try:
            arena = self._add_arena(size, alignment, stream, requested=nbytes)
        except OutOfMemoryError:
            # The upstream itself is out of memory: give back what sits unused and retry once,
            # as PyTorch frees its cached blocks and retries cudaMalloc.
            if not any(not len(arena) for arena in self._arenas):
                raise
            return self._add_after_giving_back(size, alignment, stream, requested=nbytes)
        for old in replaced:
            with contextlib.suppress(Exception):  # best effort: a refused one stays, empty
                self._remove_arena(old, stream)
        return arena

    def _add_after_giving_back(self, size: int, alignment: int, stream: Stream, *,
                               requested: int) -> Arena:
        """Give every empty arena back, then take ``size`` bytes; if the upstream still refuses,
        take arenas of the given-back sizes again (empty, so their addresses may differ) and
        raise: the pool keeps its reserve, as it was."""
        given_back = [arena.capacity for arena in self._arenas if not len(arena)]
        self._trim(stream)
        self._retries += 1
        try:
            return self._add_arena(size, alignment, stream, requested=requested)
        except OutOfMemoryError:
            for capacity in given_back:
                with contextlib.suppress(Exception):  # best effort, as the upstream allows
                    self._add_arena(capacity, _ARENA_ALIGNMENT, stream, requested=capacity)
            raise

    def _arena_size(
        self, size: int, nbytes: int, alignment: int, *, limit: int | None
    ) -> int | None:
        """The smallest arena size of ``size`` or above (at most ``limit``) whose strategy can
        hold the request: ``size`` itself, else a power of two (a buddy system needs one)."""
        rounded = (nbytes + alignment - 1) & -alignment
        power_of_two = 1 << (rounded - 1).bit_length()
        for candidate in (align_up(size, _ARENA_GRANULE), power_of_two, 2 * power_of_two):
            if limit is not None:
                candidate = min(candidate, limit)
            if candidate >= rounded and fresh_arena_fits(
                self._factory, candidate, nbytes, alignment
            ):
                return candidate
        return None

    def _add_arena(self, size: int, alignment: int, stream: Stream, *, requested: int) -> Arena:
        """Take ``size`` bytes from the upstream as a new arena; unchanged if anything fails."""
        arena_alignment = max(alignment, _ARENA_ALIGNMENT)
        try:
            base = self._upstream.allocate(size, arena_alignment, stream)
        except MemoryError as exc:
            raise self._out_of_memory(
                requested, f"the upstream refused a new arena of {format_size(size)}: {exc}"
            ) from exc
        try:
            if type(base) is not int or base & (arena_alignment - 1):
                raise InvalidAlignmentError(
                    f"the upstream returned {base!r} for an arena aligned to {arena_alignment}"
                )
            arena = Arena(size, self._factory, base=base, debug=OFF)
        except BaseException:
            self._upstream.deallocate(base, size, stream)
            raise
        self._arenas.append(arena)
        self._reserved += size
        self._total_reserved += size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        self._peak_arenas = max(self._peak_arenas, len(self._arenas))
        self._upstream_allocs += 1
        return arena

    def _trim(self, stream: Stream) -> int:
        released = 0
        for arena in [a for a in self._arenas if not len(a)]:
            self._remove_arena(arena, stream)
            released += arena.capacity
        return released

    def _release_deferred(self, arena: Arena, stream: Stream) -> None:
        """A closed pool's arena just emptied: give it back now (errors cannot be reported to
        the caller, whose free succeeded; the arena then stays, empty, until a trim)."""
        with contextlib.suppress(Exception):
            self._remove_arena(arena, stream)

    def _remove_arena(self, arena: Arena, stream: Stream) -> None:
        self._upstream.deallocate(arena.base, arena.capacity, stream)
        # Forget the arena only once the upstream took it back: a failure leaves it here.
        self._arenas.remove(arena)
        self._reserved -= arena.capacity
        self._upstream_frees += 1

    def _out_of_memory(self, nbytes: int, detail: str) -> OutOfMemoryError:
        self._ooms += 1
        free = largest = 0
        for arena in self._arenas:
            free += arena.free_bytes()
            largest = max(largest, arena.largest_free())
        return OutOfMemoryError(
            nbytes,
            free=free,
            largest_free=largest,
            capacity=self._reserved,
            limit=self._maximum,
            allocated=self._requested,
            reserved=self._reserved,
            detail=detail,
        )
