"""A growing pool: arenas taken from an upstream resource, carved up by a placement strategy.

``Pool`` is itself a resource (``allocate``/``deallocate``), so pools and adaptors nest: a pool
over mmap'd host memory, a pool over another pool, a thread-safe wrapper around a pool.

How it works. The pool holds a list of :class:`~tensorarena.core.Arena` objects, each a region
taken from the upstream in one ``upstream.allocate`` call, each with its own strategy instance.
A request is tried in the arenas in the order they were made (which packs live blocks toward
the oldest arenas, so that the newest ones empty first and ``trim()`` can give them back). When
no arena can hold it, the growth policy (:mod:`tensorarena.memory.growth`) sizes a new arena,
never smaller than the request: a request larger than every arena gets an arena of its own.

Finding the owner of a freed address is one dict lookup: the pool maps every live block's
address to its arena (the same map proves that an address is live). Only the error path
bisects the sorted arena bases, to tell a double free from a foreign address.

Vocabulary (PyTorch's): *allocated* = bytes requested by live blocks; *active* = the bytes those
blocks really occupy (requests rounded up to their alignment); *reserved* = bytes held from the
upstream, live or not. Every error is raised before any state changes; a failing upstream during
growth leaves the pool exactly as it was.

The pool is not thread-safe by itself: wrap it in :class:`tensorarena.adaptors.ThreadSafe`.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from bisect import bisect_right, insort
from dataclasses import dataclass
from types import TracebackType

from tensorarena.core.arena import Arena
from tensorarena.core.registry import StrategySpec, strategy_factory
from tensorarena.errors import (
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    OutOfMemoryError,
    SizeMismatchError,
)
from tensorarena.memory.growth import GrowthPolicy, NextPowerOfTwo
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.sizes import (
    MAX_SIZE,
    Size,
    align_up,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)

__all__ = ["Pool", "PoolStatistics"]

#: Arena sizes are rounded up to this, so that every arena can serve default-aligned requests.
_ARENA_GRANULE = DEFAULT_ALIGNMENT
#: Arenas are asked to start on a page boundary at least, so that page-aligned requests fit in
#: any arena (an arena can honour no alignment above its base's).
_ARENA_ALIGNMENT = 4096

_DEBUG = os.environ.get("TENSORARENA_DEBUG", "") not in ("", "0")


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """A snapshot of a pool's counters. Sizes in bytes; *peak* is the maximum since creation."""

    allocated_bytes: int  #: bytes requested by live blocks
    peak_allocated_bytes: int
    total_allocated_bytes: int  #: bytes requested by every allocation since creation
    total_freed_bytes: int
    active_bytes: int  #: bytes live blocks occupy (requests rounded up to their alignment)
    peak_active_bytes: int
    reserved_bytes: int  #: bytes held from the upstream
    peak_reserved_bytes: int
    total_reserved_bytes: int  #: bytes ever taken from the upstream
    total_released_bytes: int  #: bytes ever given back to the upstream
    allocation_count: int  #: live blocks
    peak_allocation_count: int
    total_allocations: int
    total_deallocations: int  #: ``reset()`` counts every block it frees
    arena_count: int
    peak_arena_count: int
    upstream_allocations: int  #: ``upstream.allocate`` calls that succeeded
    upstream_deallocations: int
    free_bytes: int  #: free bytes over all arenas
    largest_free: int  #: the largest free extent of any arena
    maximum_size: int | None  #: the cap on reserved bytes, if any

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free_bytes`` over the pool; 0 when there is no free space."""
        return 1.0 - self.largest_free / self.free_bytes if self.free_bytes else 0.0


def _release_arenas(upstream: MemoryResource, arenas: dict[int, Arena]) -> None:
    for base, arena in list(arenas.items()):
        with contextlib.suppress(Exception):  # nobody to report to from a finalizer
            upstream.deallocate(base, arena.capacity, None)
    arenas.clear()


class Pool:
    """A resource whose arenas come from ``upstream``, one placement strategy per arena.

    ``initial_size`` bytes are taken from the upstream at once (0: wait for the first request);
    whenever the pool holds nothing, its next arena is at least that large. ``growth`` sizes
    every further arena (default :class:`~tensorarena.memory.growth.NextPowerOfTwo`);
    ``maximum_size`` caps the bytes held from the upstream (at the cap, empty arenas are given
    back before a request fails). ``debug`` (default: the ``TENSORARENA_DEBUG`` environment
    variable) checks every invariant after every call.
    """

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        strategy: StrategySpec = "first_fit",
        growth: GrowthPolicy | None = None,
        initial_size: Size = "1MiB",
        maximum_size: Size | None = None,
        debug: bool = _DEBUG,
    ) -> None:
        if not callable(getattr(upstream, "allocate", None)) or not callable(
            getattr(upstream, "deallocate", None)
        ):
            raise TypeError(
                f"upstream must be a memory resource (allocate/deallocate), "
                f"not {type(upstream).__name__}"
            )
        growth = NextPowerOfTwo() if growth is None else growth
        if not callable(getattr(growth, "next_size", None)):
            raise TypeError(f"growth must be a growth policy, not {type(growth).__name__}")
        initial = parse_size(initial_size, name="initial_size", allow_zero=True)
        maximum = None if maximum_size is None else parse_size(maximum_size, name="maximum_size")
        if maximum is not None and initial > maximum:
            raise InvalidSizeError(
                f"initial_size {format_size(initial)} exceeds maximum_size {format_size(maximum)}"
            )
        self._upstream = upstream
        self._factory = strategy_factory(strategy)
        self._strategy_name: str = getattr(strategy, "name", str(strategy))
        self._growth = growth
        self._initial = initial
        self._maximum = maximum
        self._arenas: list[Arena] = []  # in creation order: the order requests try them
        self._bases: list[int] = []  # sorted arena bases, for the error path's bisect
        self._by_base: dict[int, Arena] = {}
        self._blocks: dict[int, tuple[Arena, int]] = {}  # live address -> (arena, active bytes)
        self._allocated = self._peak_allocated = self._total_allocated = self._total_freed = 0
        self._active = self._peak_active = 0
        self._reserved = self._peak_reserved = self._total_reserved = self._total_released = 0
        self._peak_count = self._total_allocations = self._total_deallocations = 0
        self._peak_arenas = self._upstream_allocs = self._upstream_deallocs = 0
        self._debug = debug
        # A pool that is garbage-collected gives its arenas back, as RMM's pool destructor does.
        # The finalizer holds the upstream and the arena index, never the pool itself.
        finalizer = weakref.finalize(self, _release_arenas, upstream, self._by_base)
        finalizer.atexit = False  # at interpreter exit the process's memory goes anyway
        if initial:
            self._add_arena(initial, DEFAULT_ALIGNMENT, None, requested=initial)

    # --- properties ------------------------------------------------------------------------

    @property
    def upstream(self) -> MemoryResource:
        """The resource the arenas come from."""
        return self._upstream

    @property
    def growth(self) -> GrowthPolicy:
        """The growth policy sizing new arenas."""
        return self._growth

    @property
    def maximum_size(self) -> int | None:
        """The cap on bytes held from the upstream, or ``None``."""
        return self._maximum

    @property
    def arenas(self) -> tuple[Arena, ...]:
        """The arenas, in creation order (for inspection; do not allocate from them directly)."""
        return tuple(self._arenas)

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Return the address of ``nbytes`` bytes aligned to ``alignment``, growing if needed.

        Raises :class:`OutOfMemoryError` when the growth policy, ``maximum_size`` or the
        upstream refuse a new arena; the pool is unchanged when it raises.
        """
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment & (alignment - 1) or alignment <= 0:
            alignment = check_alignment(alignment)
        active = (nbytes + alignment - 1) & -alignment
        mask = alignment - 1
        for arena in self._arenas:
            # Ask the strategy first: a refusal raised by the arena costs several times a
            # whole allocation, and a fragmented arena would pay it on every request.
            strategy = arena.strategy
            if (
                strategy.free_bytes() >= active
                and not arena.base & mask
                and strategy.largest_free() >= active
            ):
                try:
                    address = arena.allocate(nbytes, alignment)
                except OutOfMemoryError:
                    continue  # fragmented: try the next arena
                break
        else:
            arena = self._grow(nbytes, active, alignment, stream)
            try:
                address = arena.allocate(nbytes, alignment)
            except OutOfMemoryError:
                self._remove_arena(arena, stream)  # the probe in _grow makes this unreachable
                raise
        blocks = self._blocks
        blocks[address] = (arena, active)
        allocated = self._allocated + nbytes
        self._allocated = allocated
        if allocated > self._peak_allocated:
            self._peak_allocated = allocated
        self._total_allocated += nbytes
        active += self._active
        self._active = active
        if active > self._peak_active:
            self._peak_active = active
        self._total_allocations += 1
        if len(blocks) > self._peak_count:
            self._peak_count = len(blocks)
        if self._debug:
            self._check_invariants()
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Free the block at ``address``, which must have been allocated with ``nbytes``.

        Raises :class:`DoubleFreeError`, :class:`InvalidAddressError` (not from this pool) or
        :class:`SizeMismatchError`, leaving the pool unchanged.
        """
        entry = self._blocks.get(address) if type(address) is int else None
        if entry is None:
            raise self._not_live(address)
        arena, active = entry
        if type(nbytes) is not int:
            requested = arena.size_of(address)
            raise SizeMismatchError(
                f"block at {address:#x} was allocated with {requested} bytes, "
                f"deallocated with {nbytes!r}",
                address=address,
                given=nbytes,
                allocated=requested,
            )
        arena.deallocate(address, nbytes)  # raises SizeMismatchError before changing anything
        del self._blocks[address]
        self._allocated -= nbytes
        self._total_freed += nbytes
        self._active -= active
        self._total_deallocations += 1
        if self._debug:
            self._check_invariants()

    # --- whole-pool operations ---------------------------------------------------------------

    def reset(self) -> None:
        """Free every live block at once; the arenas stay reserved. Later frees of the old
        addresses raise :class:`DoubleFreeError`."""
        for arena in self._arenas:
            arena.reset()
        self._total_deallocations += len(self._blocks)
        self._total_freed += self._allocated
        self._blocks.clear()
        self._allocated = 0
        self._active = 0

    def trim(self, stream: Stream = None) -> int:
        """Give every empty arena back to the upstream; return the bytes released."""
        released = 0
        for arena in [a for a in self._arenas if not len(a)]:
            self._remove_arena(arena, stream)
            released += arena.capacity
        return released

    def close(self) -> None:
        """Free every block and give every arena back (``reset()`` then ``trim()``).

        The pool stays usable: a later request grows it again.
        """
        self.reset()
        self.trim()

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- queries -----------------------------------------------------------------------------

    def owns(self, address: int) -> bool:
        """True if ``address`` is a live block of this pool."""
        return address in self._blocks

    def size_of(self, address: int) -> int:
        """The requested size of the live block at ``address``."""
        entry = self._blocks.get(address) if type(address) is int else None
        if entry is None:
            raise self._not_live(address)
        return entry[0].size_of(address)

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        blocks: dict[int, int] = {}
        for arena in self._arenas:
            blocks.update(arena.live_blocks())
        return blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the pool's counters (O(number of arenas))."""
        free = largest = 0
        for arena in self._arenas:
            strategy = arena.strategy
            free += strategy.free_bytes()
            largest = max(largest, strategy.largest_free())
        return PoolStatistics(
            allocated_bytes=self._allocated,
            peak_allocated_bytes=self._peak_allocated,
            total_allocated_bytes=self._total_allocated,
            total_freed_bytes=self._total_freed,
            active_bytes=self._active,
            peak_active_bytes=self._peak_active,
            reserved_bytes=self._reserved,
            peak_reserved_bytes=self._peak_reserved,
            total_reserved_bytes=self._total_reserved,
            total_released_bytes=self._total_released,
            allocation_count=len(self._blocks),
            peak_allocation_count=self._peak_count,
            total_allocations=self._total_allocations,
            total_deallocations=self._total_deallocations,
            arena_count=len(self._arenas),
            peak_arena_count=self._peak_arenas,
            upstream_allocations=self._upstream_allocs,
            upstream_deallocations=self._upstream_deallocs,
            free_bytes=free,
            largest_free=largest,
            maximum_size=self._maximum,
        )

    def __repr__(self) -> str:
        limit = "" if self._maximum is None else f", maximum={format_size(self._maximum)}"
        return (
            f"Pool(upstream={type(self._upstream).__name__}, strategy={self._strategy_name}, "
            f"growth={self._growth!r}, arenas={len(self._arenas)}, "
            f"reserved={format_size(self._reserved)}, allocated={format_size(self._allocated)}, "
            f"live={len(self._blocks)}{limit})"
        )

    # --- growth ------------------------------------------------------------------------------

    def _grow(self, nbytes: int, active: int, alignment: int, stream: Stream) -> Arena:
        """Add an arena that can hold ``active`` bytes at ``alignment``, or raise."""
        wanted = self._growth.next_size(active, self._reserved)
        if self._reserved == 0:
            # An empty pool (new, or trimmed) starts again from its initial size.
            wanted = max(wanted or 0, self._initial, active)
        if wanted is None:
            misaligned = any(arena.base & (alignment - 1) for arena in self._arenas)
            why = f"no arena base is aligned to {alignment}" if misaligned else (
                "no arena can hold it"
            )
            raise self._out_of_memory(
                nbytes, f"{why} and the growth policy {self._growth!r} refuses to add one"
            )
        size = align_up(max(wanted, active), _ARENA_GRANULE)
        headroom = None if self._maximum is None else self._maximum - self._reserved
        if headroom is not None and active > headroom:
            empty = sum(arena.capacity for arena in self._arenas if not len(arena))
            if active <= headroom + empty:
                # What PyTorch's caching allocator does at its limit: give the unused arenas
                # back and retry, rather than fail with memory sitting idle.
                self.trim(stream)
                return self._grow(nbytes, active, alignment, stream)
            raise self._out_of_memory(
                nbytes,
                f"a new arena of {format_size(active)} would exceed maximum_size "
                f"{format_size(self._maximum or 0)} (headroom {format_size(headroom)})",
            )
        # A strategy may not be able to use a whole region (a buddy system needs a power-of-two
        # block): probe a throwaway strategy, pure bookkeeping, before asking the upstream, and
        # fall back to a power-of-two arena. Growth is rare, so the probe costs nothing overall.
        power_of_two = 1 << (active - 1).bit_length()
        for candidate in (size, power_of_two, 2 * power_of_two):
            if headroom is not None:
                candidate = min(candidate, headroom)
            probe = self._factory(candidate) if candidate >= active else None
            if probe is not None and probe.reserve(active, alignment) is not None:
                return self._add_arena(candidate, alignment, stream, requested=nbytes)
        raise self._out_of_memory(
            nbytes,
            f"the {self._strategy_name} strategy cannot place {format_size(active)} in an arena "
            f"of {format_size(size)}" + ("" if headroom is None else " within maximum_size"),
        )

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
            arena = Arena(size, self._factory, base=base)
        except BaseException:
            self._upstream.deallocate(base, size, stream)
            raise
        self._arenas.append(arena)
        insort(self._bases, base)
        self._by_base[base] = arena
        self._reserved += size
        self._total_reserved += size
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        self._peak_arenas = max(self._peak_arenas, len(self._arenas))
        self._upstream_allocs += 1
        return arena

    def _remove_arena(self, arena: Arena, stream: Stream) -> None:
        self._upstream.deallocate(arena.base, arena.capacity, stream)
        # Forget the arena only once the upstream took it back: a failure leaves it here.
        self._arenas.remove(arena)
        del self._bases[bisect_right(self._bases, arena.base) - 1]
        del self._by_base[arena.base]
        self._reserved -= arena.capacity
        self._total_released += arena.capacity
        self._upstream_deallocs += 1

    # --- errors ------------------------------------------------------------------------------

    def _out_of_memory(self, nbytes: int, detail: str) -> OutOfMemoryError:
        free = largest = 0
        for arena in self._arenas:
            free += arena.strategy.free_bytes()
            largest = max(largest, arena.strategy.largest_free())
        return OutOfMemoryError(
            nbytes,
            free=free,
            largest_free=largest,
            capacity=self._reserved,
            limit=self._maximum,
            allocated=self._allocated,
            reserved=self._reserved,
            detail=detail,
        )

    def _not_live(self, address: object) -> InvalidAddressError:
        if type(address) is not int:
            return InvalidAddressError(
                f"address must be an int, not {type(address).__name__}", address=-1
            )
        i = bisect_right(self._bases, address) - 1
        if i >= 0:
            arena = self._by_base[self._bases[i]]
            if arena.owns(address):
                try:
                    arena.size_of(address)  # not live: raises the arena's precise error
                except InvalidAddressError as exc:
                    return exc
        return InvalidAddressError(
            f"address {address:#x} was not allocated by this pool (no arena holds it; "
            "an arena given back by trim() no longer counts)",
            address=address,
        )

    # --- invariants --------------------------------------------------------------------------

    def _check_invariants(self) -> None:
        """Check every arena's invariants and the pool's own; raise AssertionError if broken."""
        for arena in self._arenas:
            arena._check_invariants()
        assert self._bases == sorted(a.base for a in self._arenas), "arena bases out of sync"
        assert set(self._by_base.values()) == set(self._arenas), "arena index out of sync"
        previous_end = 0
        for base in self._bases:
            assert base >= previous_end, f"arenas overlap at {base:#x}"
            previous_end = base + self._by_base[base].capacity
        assert self._reserved == sum(a.capacity for a in self._arenas), "reserved bytes drift"
        assert len(self._blocks) == sum(len(a) for a in self._arenas), "live block count drift"
        assert self._allocated == sum(a.allocated for a in self._arenas), "allocated bytes drift"
        assert self._active == sum(active for _, active in self._blocks.values()), "active drift"
        for address, (arena, _) in self._blocks.items():
            assert arena.is_live(address), f"block {address:#x} is not live in its arena"
        if self._maximum is not None:
            assert self._reserved <= self._maximum, "reserved bytes exceed maximum_size"
