"""An arena: one contiguous region, one placement strategy, the map of live blocks, counters.

The arena is where user input is checked. A strategy sees only valid requests; every error is
raised before any state changes, so a failed call leaves the arena exactly as it was.

Sizes are rounded up to a multiple of the request's alignment before they reach the strategy (as
RMM does), so aligned requests never leave slivers that no aligned request could use. Statistics
count the bytes *requested*; the rounding shows up as reserved-but-unallocated space.

The region starts at ``base`` (0 for bookkeeping alone, or the address of real memory); an
alignment is honoured on absolute addresses, so it may not exceed the alignment of ``base``.

The hot paths (``allocate``/``deallocate``) are written for the interpreter, where every
arithmetic operation allocates an int (~15 ns here) and every dict operation costs ~40 ns in a
real access pattern, so they do as few of either as the checks allow:

* The common request (an ``int`` size at the default alignment) is recognised by one identity
  test and two cheap comparisons; everything else (other alignments, NumPy integers, strings,
  bad input) takes ``_allocate_general``. The upper size bound is checked only once the
  strategy has refused a request: a size above ``MAX_SIZE`` exceeds every capacity, so the
  strategy refuses it and the arena then raises ``InvalidSizeError`` instead of running out.
* The map of blocks stores the requested size alone (an ``int``) for a block at the default
  alignment, whose reserved size the rounding recomputes, and ``(requested, reserved)`` for the
  others. A freed address stays in the map with ``None`` (a tombstone): a second free finds it
  and is reported as a double free rather than as a foreign address, at no cost to the good path
  (adding to ``None`` or to a tuple fails, and that failure *is* the branch to the general
  path), and handing the address out again overwrites it. The map therefore grows with the number
  of distinct addresses ever used, as a set of freed addresses would.
* ``reserved`` is derived from the strategy's free bytes rather than counted, and the peak is
  folded in lazily: ``allocated`` only reaches a new high just before it decreases, so
  ``deallocate`` (and ``reset``) record it and the statistics take ``max(peak, allocated)``.
* The strategy's methods are called through locals (``self._reserve(...)`` would compile to a
  method lookup that CPython 3.11 cannot specialise for an instance attribute), and an arena at
  base 0 skips adding and subtracting the base.
* Debug mode (invariants checked after every call) swaps checked methods in at construction, so
  the fast methods do not test a flag.

Measured costs and what did not pay are in ``bench/RESULTS.md`` (allocation core).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tensorarena.core.registry import StrategySpec, strategy_factory
from tensorarena.core.strategy import PlacementStrategy
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    OutOfMemoryError,
    SizeMismatchError,
)
from tensorarena.sizes import (
    MAX_SIZE,
    Size,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)

__all__ = ["DEFAULT_ALIGNMENT", "DEFAULT_STRATEGY", "Arena", "ArenaStatistics"]

# An entry of the block map: requested (default alignment), (requested, reserved), None if freed.
_Entry = int | tuple[int, int] | None

#: Default alignment of every allocation, as in RMM and cudaMalloc.
DEFAULT_ALIGNMENT = 256

#: Default placement strategy: the lowest fragmentation for an O(log n) search.
DEFAULT_STRATEGY = "best_fit"

# MAX_SIZE is a power of two, so one shift tells whether a size is in range.
_SIZE_BITS = MAX_SIZE.bit_length() - 1
if 1 << _SIZE_BITS != MAX_SIZE:  # pragma: no cover - guards the shift test in allocate()
    raise ImportError("tensorarena.sizes.MAX_SIZE must be a power of two")
if DEFAULT_ALIGNMENT != 256:  # pragma: no cover - the hot paths spell out 255 and 256
    raise ImportError("Arena's hot paths assume DEFAULT_ALIGNMENT == 256")


_DEBUG = os.environ.get("TENSORARENA_DEBUG", "") not in ("", "0")


@dataclass(frozen=True, slots=True)
class ArenaStatistics:
    """A snapshot of an arena's counters. All sizes in bytes."""

    capacity: int
    allocated: int  #: bytes requested by live blocks
    peak_allocated: int  #: the most ``allocated`` has been since creation
    #: bytes the strategy holds for live blocks: requests rounded up to their alignment (and, for
    #: a buddy system, to a power of two)
    reserved: int
    free: int  #: free bytes according to the strategy
    largest_free: int  #: the largest request that could still succeed
    free_extents: int  #: number of separate free extents
    live_blocks: int
    alloc_count: int  #: successful allocations since creation
    free_count: int  #: deallocations since creation (``reset`` counts every block it frees)

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free``: 0 when the free space is one extent (or there is none)."""
        return 1.0 - self.largest_free / self.free if self.free else 0.0


class Arena:
    """One region ``[base, base + capacity)`` carved up by one placement strategy."""

    def __init__(
        self,
        capacity: Size,
        strategy: StrategySpec = DEFAULT_STRATEGY,
        *,
        base: int = 0,
        debug: bool = _DEBUG,
    ) -> None:
        self._capacity = parse_size(capacity, name="capacity")
        if type(base) is not int or base < 0:
            raise InvalidAddressError(f"base must be a non-negative int, got {base!r}", address=-1)
        self._strategy: PlacementStrategy = strategy_factory(strategy)(self._capacity)
        self._reserve = self._strategy.reserve
        self._release = self._strategy.release
        self._base = base
        # Largest power of two dividing base: alignments above it cannot be honoured.
        self._base_alignment = base & -base if base else 1 << 62
        # Every alignment this arena honours, so the hot path validates one with a set lookup.
        self._alignments = frozenset(
            1 << k for k in range(min(self._base_alignment, MAX_SIZE).bit_length())
        )
        # The alignment that identity alone validates; a fresh object (never passed in) when the
        # base cannot honour the default.
        self._fast_alignment: object = (
            DEFAULT_ALIGNMENT if DEFAULT_ALIGNMENT in self._alignments else object()
        )
        # address -> requested (default alignment) or (requested, reserved) while live, None once
        # freed (to tell double frees from foreign addresses)
        self._live: dict[int, _Entry] = {}
        self._allocated = 0
        # Every byte the strategy does not count as free is held by a live block, so "reserved"
        # is derived from its free bytes rather than counted on the hot path.
        self._initial_free = self._strategy.free_bytes()
        # The most ``allocated`` has been when it last decreased; the peak is max(this, allocated).
        self._peak = 0
        self._alloc_count = 0
        self._free_count = 0
        if debug:
            self.allocate = self._allocate_checked  # type: ignore[method-assign]
            self.deallocate = self._deallocate_checked  # type: ignore[method-assign]

    # --- properties ------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Size of the region in bytes."""
        return self._capacity

    @property
    def base(self) -> int:
        """Address of the region's first byte."""
        return self._base

    @property
    def strategy(self) -> PlacementStrategy:
        """The placement strategy managing the free space."""
        return self._strategy

    @property
    def allocated(self) -> int:
        """Bytes requested by live blocks."""
        return self._allocated

    # --- allocation ------------------------------------------------------------------------

    def allocate(self, nbytes: Size, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Return the address of ``nbytes`` fresh bytes aligned to ``alignment``.

        Raises :class:`OutOfMemoryError` when no free extent is large enough, and
        :class:`InvalidSizeError` / :class:`InvalidAlignmentError` for bad arguments.
        """
        # The default alignment is a cached small int: identity settles the common case, and
        # ``_fast_alignment`` is a fresh object when the base cannot honour it.
        if alignment is self._fast_alignment and type(nbytes) is int and nbytes > 0:
            # Through a local: a call written ``self._reserve(...)`` compiles to a method lookup
            # that CPython 3.11 cannot specialise for an instance attribute (~30 ns a call).
            reserve = self._reserve
            offset = reserve((nbytes + 255) & -256, 256)
            if offset is None:
                raise self._refused(nbytes, 256)
            # A bookkeeping arena (base 0) skips the addition: each int operation allocates.
            address = self._base + offset if self._base else offset
            self._live[address] = nbytes
            self._allocated += nbytes
            self._alloc_count += 1
            return address
        return self._allocate_general(nbytes, alignment)

    def deallocate(self, address: int, nbytes: Size | None = None) -> None:
        """Free the block at ``address``; if ``nbytes`` is given it must match the allocation.

        Raises :class:`DoubleFreeError` for a block already freed (or released by ``reset``),
        :class:`InvalidAddressError` for an address never allocated, :class:`SizeMismatchError`
        when ``nbytes`` differs from the allocation; the arena is unchanged after any of them.
        """
        live = self._live
        try:
            requested = live[address]
            # TypeError for a tuple (another alignment) or None (freed): the general path.
            reserved = (requested + 255) & -256  # type: ignore[operator]
        except (KeyError, TypeError):
            return self._deallocate_general(address, nbytes)
        if nbytes is not None and (type(nbytes) is not int or nbytes != requested):
            self._check_free_size(address, requested, nbytes)  # type: ignore[arg-type]
        live[address] = None
        release = self._release  # a local, as in allocate
        release(address - self._base if self._base else address, reserved)
        allocated = self._allocated
        if allocated > self._peak:
            self._peak = allocated
        self._allocated = allocated - requested  # type: ignore[operator]
        self._free_count += 1

    def _allocate_general(self, nbytes: Size, alignment: int) -> int:
        """``allocate`` for any alignment and any size type, validating both."""
        if type(nbytes) is not int or (nbytes - 1) >> _SIZE_BITS:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment not in self._alignments:
            alignment = self._checked_alignment(alignment)
        reserved = (nbytes + alignment - 1) & -alignment
        offset = self._reserve(reserved, alignment)
        if offset is None:
            raise self._refused(nbytes, alignment)
        address = self._base + offset
        # The short entry whenever the default rounding recomputes ``reserved``.
        self._live[address] = nbytes if alignment is self._fast_alignment else (nbytes, reserved)
        self._allocated += nbytes
        self._alloc_count += 1
        return address

    def _deallocate_general(self, address: int, nbytes: Size | None) -> None:
        """``deallocate`` for a block of another alignment, or one that is not live."""
        live = self._live
        try:
            # KeyError: never allocated; TypeError: a tombstone (None) or an unhashable address.
            requested, reserved = live[address]  # type: ignore[misc]
        except (KeyError, TypeError):
            raise self._not_live(address) from None
        if nbytes is not None and (type(nbytes) is not int or nbytes != requested):
            self._check_free_size(address, requested, nbytes)
        live[address] = None
        self._release(address - self._base, reserved)
        allocated = self._allocated
        if allocated > self._peak:
            self._peak = allocated
        self._allocated = allocated - requested
        self._free_count += 1

    def _allocate_checked(self, nbytes: Size, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """``allocate``, then every invariant (debug mode)."""
        address = Arena.allocate(self, nbytes, alignment)
        self._check_invariants()
        return address

    def _deallocate_checked(self, address: int, nbytes: Size | None = None) -> None:
        """``deallocate``, then every invariant (debug mode)."""
        Arena.deallocate(self, address, nbytes)
        self._check_invariants()

    def reset(self) -> None:
        """Free every live block at once; freeing one of them afterwards is a double free."""
        self._free_count = self._alloc_count
        self._live = dict.fromkeys(self._live)
        self._peak = max(self._peak, self._allocated)
        self._allocated = 0
        self._strategy.reset()

    # --- queries ---------------------------------------------------------------------------

    def owns(self, address: int) -> bool:
        """True if ``address`` lies inside this arena's region (live or not)."""
        return self._base <= address < self._base + self._capacity

    def is_live(self, address: int) -> bool:
        """True if ``address`` is the start of a live block."""
        return self._live.get(address) is not None

    def size_of(self, address: int) -> int:
        """The requested size of the live block at ``address``."""
        entry = self._live.get(address)
        if entry is None:
            raise self._not_live(address)
        return entry if isinstance(entry, int) else entry[0]

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        return {
            address: entry if isinstance(entry, int) else entry[0]
            for address, entry in self._live.items()
            if entry is not None
        }

    def __len__(self) -> int:
        return self._alloc_count - self._free_count

    def statistics(self) -> ArenaStatistics:
        """A frozen snapshot of the arena's counters."""
        strategy = self._strategy
        return ArenaStatistics(
            capacity=self._capacity,
            allocated=self._allocated,
            peak_allocated=max(self._peak, self._allocated),
            reserved=self._initial_free - strategy.free_bytes(),
            free=strategy.free_bytes(),
            largest_free=strategy.largest_free(),
            free_extents=strategy.free_extent_count(),
            live_blocks=self._alloc_count - self._free_count,
            alloc_count=self._alloc_count,
            free_count=self._free_count,
        )

    def __repr__(self) -> str:
        return (
            f"Arena(capacity={format_size(self._capacity)}, base={self._base:#x}, "
            f"strategy={self._strategy.name}, allocated={format_size(self._allocated)}, "
            f"live={len(self)}, free={format_size(self._strategy.free_bytes())})"
        )

    # --- errors ----------------------------------------------------------------------------

    def _checked_alignment(self, alignment: object) -> int:
        """Validate an alignment the fast path did not recognise; return it as an int."""
        checked = check_alignment(alignment)
        if checked > self._base_alignment:
            raise InvalidAlignmentError(
                f"alignment {checked} exceeds the alignment of the arena's base "
                f"address {self._base:#x}"
            )
        return checked

    def _check_free_size(self, address: int, requested: int, nbytes: object) -> None:
        """Raise unless ``nbytes`` (given to ``deallocate``) names the block's requested size."""
        given = nbytes
        if type(nbytes) is not int:
            given = check_nbytes(nbytes)
        if given != requested:
            raise SizeMismatchError(
                f"block at {address:#x} was allocated with {requested} bytes, "
                f"deallocated with {nbytes!r}",
                address=address,
                given=given,  # type: ignore[arg-type]
                allocated=requested,
            )

    def _refused(self, nbytes: int, alignment: int) -> InvalidSizeError | OutOfMemoryError:
        """The error for a request the strategy refused: too large for any arena, or no room."""
        if nbytes > MAX_SIZE:
            return _size_error(nbytes)
        reserved = (nbytes + alignment - 1) & -alignment
        largest_free = self._strategy.largest_free()
        detail = ""
        if reserved <= largest_free:
            detail = (
                f"no free extent holds {reserved} bytes at alignment {alignment} "
                f"(the strategy's placement rules leave no room for it)"
            )
        return OutOfMemoryError(
            nbytes,
            free=self._strategy.free_bytes(),
            largest_free=largest_free,
            capacity=self._capacity,
            allocated=self._allocated,
            reserved=self._initial_free - self._strategy.free_bytes(),
            detail=detail,
        )

    def _not_live(self, address: object) -> InvalidAddressError:
        if type(address) is not int:
            return InvalidAddressError(
                f"address must be an int, not {type(address).__name__}", address=-1
            )
        if address in self._live:  # not live, so a tombstone: freed before
            return DoubleFreeError(
                f"double free: block at {address:#x} was already freed (or released by reset())",
                address=address,
            )
        where = "inside" if self.owns(address) else "outside"
        return InvalidAddressError(
            f"address {address:#x} was never allocated by this arena ({where} its region "
            f"[{self._base:#x}, {self._base + self._capacity:#x}))",
            address=address,
        )

    # --- invariants ------------------------------------------------------------------------

    def _check_invariants(self) -> None:
        """Check every invariant (O(n log n)); raise AssertionError on the first broken one."""
        strategy = self._strategy
        entries = [
            (a, (e, (e + 255) & -256) if isinstance(e, int) else e)
            for a, e in self._live.items()
            if e is not None
        ]
        assert len(entries) == len(self), "live count drifts"
        blocks = sorted((a - self._base, e[1]) for a, e in entries)
        extents = strategy.free_extents()
        previous_end = 0
        for offset, reserved in blocks:
            assert offset >= previous_end, f"live blocks overlap at offset {offset}"
            previous_end = offset + reserved
        assert previous_end <= self._capacity, "a live block runs past the region"
        assert self._allocated == sum(e[0] for _, e in entries), "allocated bytes drift"
        reserved = self._initial_free - strategy.free_bytes()
        requested_reserved = sum(e[1] for _, e in entries)
        # Free-list strategies carve exactly what is asked; others (buddy) may round it up.
        if getattr(strategy, "exact", False):
            assert reserved == requested_reserved, "reserved bytes drift"
        assert reserved >= requested_reserved, "reserved bytes drift"
        free_total = 0
        previous_end = 0
        for offset, size in extents:
            assert size > 0 and offset >= previous_end, "free extents overlap or are empty"
            previous_end = offset + size
            free_total += size
        assert previous_end <= self._capacity, "a free extent runs past the region"
        assert free_total == strategy.free_bytes(), "free bytes disagree with free extents"
        assert free_total + reserved <= self._capacity, "bytes counted twice"
        # No live block may intersect a free extent: merge-walk the two sorted lists.
        i = 0
        for offset, reserved in blocks:
            while i < len(extents) and extents[i][0] + extents[i][1] <= offset:
                i += 1
            if i < len(extents):
                assert extents[i][0] >= offset + reserved, f"block at {offset} is also free"
        strategy_free = strategy.free_bytes()
        if strategy.coalesces and not entries:
            # Coalescing means an empty region is its initial extent set again (one extent, or
            # for a buddy system its initial blocks).
            initial = getattr(strategy, "initial_extents", None)
            expected = initial() if initial is not None else [(0, self._capacity)]
            assert extents == expected, f"an empty arena should be {expected}, not {extents[:4]}"

        assert strategy_free <= self._capacity, "more free bytes than capacity"


def _size_error(nbytes: int) -> InvalidSizeError:
    """The error ``parse_size`` raises for an int size out of range."""
    try:
        parse_size(nbytes, name="nbytes")
    except InvalidSizeError as error:
        return error
    raise AssertionError(f"{nbytes} is a valid size")  # pragma: no cover - callers checked


