"""An arena: one contiguous region, one placement strategy, the map of live blocks, counters.

The arena is where user input is checked. A strategy sees only valid requests; every error is
raised before any state changes, so a failed call leaves the arena exactly as it was.

Sizes are rounded up to a multiple of the request's alignment before they reach the strategy (as
RMM does), so aligned requests never leave slivers that no aligned request could use. Statistics
count the bytes *requested*; the rounding shows up as reserved-but-unallocated space.

The region starts at ``base`` (0 for bookkeeping alone, or the address of real memory); an
alignment is honoured on absolute addresses, so it may not exceed the alignment of ``base``.

The hot paths (``allocate``/``deallocate``) are written for the interpreter, where every
arithmetic operation allocates an int and every dict operation costs more still in a
real access pattern, so they do as few of either as the checks allow:

* The common request (an ``int`` size at the default alignment) is recognised by one identity
  test and two cheap comparisons; everything else (other alignments, NumPy integers, strings,
  bad input) takes ``_allocate_general``. The upper size bound is checked only once the
  strategy has refused a request: a size above ``MAX_SIZE`` exceeds every capacity, so the
  strategy refuses it and the arena then raises ``InvalidSizeError`` instead of running out.
* The map of blocks holds the live blocks alone: the requested size (an ``int``) for a block at
  the default alignment, whose reserved size the rounding recomputes, and ``(requested,
  reserved)`` for the others (adding to a tuple fails, and that failure *is* the branch to the
  general path).
* Freed addresses are remembered in a ring of the last ``recent_frees`` (see
  :mod:`tensorarena.core._recent_frees`): the good path pays one list store; only an error
  looks in the ring, to tell a double free from a foreign address.
* ``reserved`` is derived from the strategy's free bytes rather than counted, and the peak is
  folded in lazily: ``allocated`` only reaches a new high just before it decreases, so
  ``deallocate`` (and ``reset``) record it and the statistics take ``max(peak, allocated)``.
* The strategy's methods are called through locals (``self._reserve(...)`` would compile to a
  method lookup that CPython 3.11 cannot specialise for an instance attribute), and an arena at
  base 0 skips adding and subtracting the base.
* Addresses must be exact ints: ``1234.0`` hashes like ``1234`` and would find a live block,
  so the good path tests the address's type once, after the lookup, alongside the size test.
* Debug mode (invariants checked after every call, graded by :mod:`tensorarena.debug`; the
  checks are in :mod:`tensorarena.core._arena_check`) is one test of an int at the end of each
  call: swapping checked methods in at construction, which saved it, cannot be done to a class
  compiled by mypyc (see below). The errors are built off the hot paths, in
  :mod:`tensorarena.core._arena_errors`.

The module is also compiled by mypyc (``setup.py``; the pure build runs this same file), which
enforces annotations where interpreted code calls in: the parameters that take a user's input
are annotated ``Size | Any``, ``int | Any`` (what they mean, and "anything, checked here"), so a
wrong type gets the library's own error (``InvalidSizeError`` for ``1.5``) in both builds, not
a ``TypeError`` in one of them.

An arena is bookkeeping over numbers: it speaks the resource protocol (so a ``Pool`` can carve
an arena's range) but declares ``MemoryKind.ADDRESS_SPACE``, and ``tensorarena.empty`` refuses
to build arrays over it whatever its ``base``.

Measured costs and what did not pay are in ``bench/RESULTS.md`` (allocation core).
"""

from __future__ import annotations

from typing import Any, Final

from tensorarena.core._arena_check import check_arena
from tensorarena.core._arena_errors import (
    check_free_size,
    checked_alignment,
    not_live_error,
    out_of_memory_error,
    size_error,
)
from tensorarena.core._builtin import BuiltinStrategy
from tensorarena.core._recent_frees import RECENT_FREES, recent_frees_length, remember_free
from tensorarena.core.registry import StrategySpec, strategy_factory
from tensorarena.core.strategy import PlacementStrategy, StrategyFactory
from tensorarena.debug import EXPENSIVE, OFF, resolve_debug
from tensorarena.errors import InvalidAddressError, InvalidSizeError, OutOfMemoryError
from tensorarena.memory_kind import MemoryKind
from tensorarena.sizes import MAX_SIZE, Size, check_address, check_nbytes, format_size, parse_size
from tensorarena.stats import ArenaStatistics, Count

__all__ = [
    "DEFAULT_ALIGNMENT",
    "DEFAULT_STRATEGY",
    "RECENT_FREES",
    "Arena",
    "fresh_arena_fits",
    "recent_frees_length",
]

# An entry of the block map: requested (default alignment), or (requested, reserved).
_Entry = int | tuple[int, int]

#: Default alignment of every allocation, as in RMM and cudaMalloc.
DEFAULT_ALIGNMENT: Final = 256

#: Default placement strategy: the lowest fragmentation for an O(log n) search.
DEFAULT_STRATEGY: Final = "best_fit"

# MAX_SIZE is a power of two, so one shift tells whether a size is in range.
_SIZE_BITS: Final = MAX_SIZE.bit_length() - 1
if 1 << _SIZE_BITS != MAX_SIZE:  # pragma: no cover - guards the shift test in allocate()
    raise ImportError("tensorarena.sizes.MAX_SIZE must be a power of two")
if DEFAULT_ALIGNMENT != 256:  # pragma: no cover - the hot paths spell out 255 and 256
    raise ImportError("Arena's hot paths assume DEFAULT_ALIGNMENT == 256")


def fresh_arena_fits(
    factory: StrategyFactory, capacity: int, nbytes: int, alignment: int
) -> bool:
    """Whether a new, empty arena of ``capacity`` bytes would hold one ``nbytes`` request.

    A strategy may not be able to use a whole region (a buddy system serves power-of-two
    blocks), so a pool asks this before it takes a region from its upstream. Bookkeeping only.
    """
    reserved = (nbytes + alignment - 1) & -alignment
    return reserved <= capacity and factory(capacity).reserve(reserved, alignment) is not None


class Arena:
    """One region ``[base, base + capacity)`` carved up by one placement strategy.

    ``debug`` grades the invariant checks run after every call (see :mod:`tensorarena.debug`;
    ``None`` reads the current default when the arena is made).
    """

    #: An arena is bookkeeping: its addresses are numbers, whatever ``base`` points at.
    memory_kind = MemoryKind.ADDRESS_SPACE

    def __init__(
        self,
        capacity: Size | Any,
        strategy: StrategySpec | Any = DEFAULT_STRATEGY,
        *,
        base: int | Any = 0,
        debug: int | bool | Any | None = None,
    ) -> None:
        self._capacity = parse_size(capacity, name="capacity")
        base = check_address(base, name="base")
        self._strategy: PlacementStrategy = strategy_factory(strategy)(self._capacity)
        self._reserve = self._strategy.reserve
        self._release = self._strategy.release
        # A built-in strategy is called through its class (see core/_builtin.py): directly, with
        # unboxed ints, in the compiled build; any other through the bound methods above.
        self._builtin: BuiltinStrategy | None = (
            self._strategy if isinstance(self._strategy, BuiltinStrategy) else None
        )
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
        # address -> requested (default alignment) or (requested, reserved), live blocks only
        self._live: dict[int, _Entry] = {}
        # The last recent_frees_length(capacity) freed addresses, the k-th free in slot
        # k & _recent_mask (None: no free yet), to tell double frees from foreign addresses. It
        # grows as frees come (a pool may hold many arenas that free little): a slot past its
        # end is not written.
        self._recent_mask = recent_frees_length(self._capacity) - 1
        self._recent_frees: list[int | None] = []
        # Requested bytes, kept as a total and a freed sum (a Count's own model): allocate adds
        # to one int, deallocate to the other, and the current value is their difference. The
        # peak is folded in lazily: the count only reaches a new high just before it decreases,
        # so deallocate (and reset) record it and statistics() take max(peak, current). The
        # bytes the blocks occupy are the strategy's (capacity less its free bytes): counting
        # them here as well cost ~10 % of a pair (measured), and a pool above counts its own.
        self._requested_total = self._requested_freed = 0
        self._peak = 0
        self._alloc_count = 0
        self._free_count = 0
        self._num_ooms = 0
        # Every byte the strategy does not count as free is held by a live block.
        self._initial_free = self._strategy.free_bytes()
        self._debug = resolve_debug(debug)

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
    def recent_frees(self) -> int:
        """How many of its last freed addresses the arena remembers to name a double free:
        :func:`recent_frees_length` of its capacity (at most :data:`RECENT_FREES`)."""
        return self._recent_mask + 1

    @property
    def strategy_name(self) -> str:
        """The placement strategy's name (``"best_fit"``, ...)."""
        return self._strategy.name

    @property
    def requested(self) -> int:
        """Bytes requested by live blocks."""
        return self._requested_total - self._requested_freed

    @property
    def debug(self) -> int:
        """The debug level: 0 off, 1 cheap checks, 2 every invariant after every call."""
        return self._debug

    # --- allocation ------------------------------------------------------------------------

    def allocate(
        self, nbytes: Size | Any, alignment: int | Any = DEFAULT_ALIGNMENT, stream: Any = None
    ) -> int | Any:
        """Return the address of ``nbytes`` fresh bytes aligned to ``alignment``.

        Raises :class:`OutOfMemoryError` when no free extent is large enough, and
        :class:`InvalidSizeError` / :class:`InvalidAlignmentError` for bad arguments.
        ``stream`` is accepted for the resource protocol and ignored (bookkeeping has no order).
        """
        # ``Any``: the compiled build keeps the caller's int object and the strategy's as they
        # are, where ``int`` locals would be unboxed and boxed again (an allocation each) to
        # become the block map's key and value. The return type ``int | Any`` (an int, typed
        # loosely) hands the same object back: ``-> int`` would unbox it and box it again.
        requested: Any = nbytes
        # The default alignment is a cached small int: identity settles the common case, and
        # ``_fast_alignment`` is a fresh object when the base cannot honour it.
        if alignment is self._fast_alignment and type(nbytes) is int and nbytes > 0:
            # Through a local: a call written ``self._reserve(...)`` compiles to a method lookup
            # that CPython 3.11 cannot specialise for an instance attribute (~30 ns a call).
            builtin = self._builtin
            reserved = (nbytes + 255) & -256
            if builtin is not None:
                offset: Any = builtin.reserve(reserved, 256)
            else:
                reserve = self._reserve
                offset = reserve(reserved, 256)
            if offset is None:
                raise self._refused(nbytes, 256)
            # A bookkeeping arena (base 0) skips the addition: each int operation allocates.
            address: Any = self._base + offset if self._base else offset
            self._live[address] = requested
            self._requested_total += nbytes
            self._alloc_count += 1
            if self._debug:
                self._check_invariants(self._debug)
            return address  # the strategy's int object, or base + it
        general = self._allocate_general(nbytes, alignment)
        if self._debug:
            self._check_invariants(self._debug)
        return general

    def try_allocate(self, nbytes: int, alignment: int) -> int | None:
        """``allocate`` for callers that validated both arguments (exact ints, ``alignment``
        honoured by this arena): the address, or ``None`` when no extent can hold the request.

        A pool tries its arenas in turn; a refusal here costs one strategy call, where a raised
        :class:`OutOfMemoryError` would cost several times a whole allocation.
        """
        reserved = (nbytes + alignment - 1) & -alignment
        offset = self._reserve(reserved, alignment)
        if offset is None:
            return None
        address = self._base + offset
        self._live[address] = nbytes if alignment is self._fast_alignment else (nbytes, reserved)
        self._requested_total += nbytes
        self._alloc_count += 1
        if self._debug != OFF:
            self._check_invariants(self._debug)
        return address

    def deallocate(
        self, address: int | Any, nbytes: Size | Any | None = None, stream: Any = None
    ) -> None:
        """Free the block at ``address``; if ``nbytes`` is given it must match the allocation.

        Raises :class:`DoubleFreeError` for a block freed (or released by ``reset``) within
        the last :attr:`recent_frees` frees, :class:`InvalidAddressError` for an address that
        is not live otherwise (never allocated, freed before those, or not an int),
        :class:`SizeMismatchError` when ``nbytes`` differs from the allocation; the arena is
        unchanged after any of them.
        """
        live = self._live
        # The caller's object, kept out of the narrowing below: compiled, the narrowed ``int``
        # is unboxed, and would be boxed anew (an allocation) as a key and as a ring entry.
        key: Any = address
        try:
            # KeyError (not live) or TypeError for a tuple (another alignment): the general path.
            # The compiled build raises it here, checking the declared ``int`` (so the arithmetic
            # below is native), the interpreter on the addition.
            requested: int = live[address]  # type: ignore[assignment]
            reserved = (requested + 255) & -256
        except (KeyError, TypeError):
            self._deallocate_general(address, nbytes)
            if self._debug:
                self._check_invariants(self._debug)
            return
        # A float or a NumPy integer equal to a live address finds it too: only exact ints (and
        # the exact size, when given) stay on this path.
        if type(address) is not int or (
            nbytes is not None and (type(nbytes) is not int or nbytes != requested)
        ):
            self._deallocate_general(address, nbytes)
            if self._debug:
                self._check_invariants(self._debug)
            return
        del live[key]
        count = self._free_count
        try:
            self._recent_frees[count & self._recent_mask] = key
        except IndexError:  # the ring has not grown to that slot yet
            self._remember_free(count, key)
        self._free_count = count + 1
        builtin = self._builtin
        if builtin is not None:
            builtin.release(address - self._base if self._base else address, reserved)
        else:
            release = self._release  # a local, as in allocate
            release(address - self._base if self._base else address, reserved)
        freed = self._requested_freed
        if self._requested_total - freed > self._peak:
            self._peak = self._requested_total - freed
        self._requested_freed = freed + requested
        if self._debug:
            self._check_invariants(self._debug)

    def _allocate_general(self, nbytes: Size | Any, alignment: int | Any) -> int:
        """``allocate`` for any alignment and any size type, validating both."""
        if type(nbytes) is not int or (nbytes - 1) >> _SIZE_BITS:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment not in self._alignments:
            alignment = checked_alignment(alignment, self._base, self._base_alignment)
        reserved = (nbytes + alignment - 1) & -alignment
        offset = self._reserve(reserved, alignment)
        if offset is None:
            raise self._refused(nbytes, alignment)
        address = self._base + offset
        # The short entry whenever the default rounding recomputes ``reserved``.
        self._live[address] = nbytes if alignment is self._fast_alignment else (nbytes, reserved)
        self._requested_total += nbytes
        self._alloc_count += 1
        return address

    def _deallocate_general(self, address: object, nbytes: Size | Any | None) -> None:
        """``deallocate`` for any address type, any block, any size type, validating all."""
        address = check_address(address)
        entry = self._live.get(address)
        if entry is None:
            raise self._not_live(address)
        if isinstance(entry, int):
            requested, reserved = entry, (entry + 255) & -256
        else:
            requested, reserved = entry
        if nbytes is not None and (type(nbytes) is not int or nbytes != requested):
            check_free_size(address, requested, nbytes)
        del self._live[address]
        self._remember_free(self._free_count, address)
        self._free_count += 1
        self._release(address - self._base, reserved)
        self._fold_peak()
        self._requested_freed += requested

    def reset(self) -> None:
        """Free every live block at once; freeing one of them afterwards is a double free
        (for the last :attr:`recent_frees` of them, as for any free).

        An arena is bookkeeping; a :class:`~tensorarena.memory.Pool` over real memory refuses
        to reset while blocks are live.
        """
        # Each block is freed as deallocate() would free it, and counted among the recent frees.
        count = self._free_count
        for address in self._live:
            self._remember_free(count, address)
            count += 1
        self._free_count = count  # == self._alloc_count
        self._live = {}
        self._fold_peak()
        self._requested_freed = self._requested_total
        self._strategy.reset()

    def _remember_free(self, count: int, address: int) -> None:
        """Put the address of the ``count``-th free in its slot, growing the ring to it."""
        remember_free(self._recent_frees, self._recent_mask, count, address)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value (``torch.cuda.reset_peak_memory_stats``)."""
        self._peak = self._requested_total - self._requested_freed

    def _fold_peak(self) -> None:
        """Record the current requested bytes in the peak (before a decrease)."""
        self._peak = max(self._peak, self._requested_total - self._requested_freed)

    # --- queries ---------------------------------------------------------------------------

    def owns(self, address: object) -> bool:
        """True if ``address`` lies inside this arena's region (live or not)."""
        return type(address) is int and self._base <= address < self._base + self._capacity

    def is_live(self, address: object) -> bool:
        """True if ``address`` (an exact int) is the start of a live block."""
        return type(address) is int and address in self._live

    def size_of(self, address: int | Any) -> int:
        """The requested size of the live block at ``address``."""
        address = check_address(address)
        entry = self._live.get(address)
        if entry is None:
            raise self._not_live(address)
        return entry if isinstance(entry, int) else entry[0]

    def honours(self, alignment: int) -> bool:
        """Whether this arena's base allows blocks aligned to ``alignment``."""
        return alignment in self._alignments

    def free_bytes(self) -> int:
        """Free bytes in the region (usable or not)."""
        return self._strategy.free_bytes()

    def largest_free(self) -> int:
        """The largest request (rounded to its alignment) that could still succeed."""
        return self._strategy.largest_free()

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        return {
            address: entry if isinstance(entry, int) else entry[0]
            for address, entry in self._live.items()
        }

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(address, nbytes)``, by address (for checks and pictures)."""
        return [(self._base + offset, size) for offset, size in self._strategy.free_extents()]

    def __len__(self) -> int:
        return self._alloc_count - self._free_count

    def statistics(self) -> ArenaStatistics:
        """A frozen snapshot in the vocabulary of :mod:`tensorarena.stats`.

        ``allocated_bytes`` is what the strategy holds for live blocks now (requests rounded to
        their alignment, and for a buddy system to powers of two): a gauge, not a count.
        """
        strategy = self._strategy
        free = strategy.free_bytes()
        live = self._alloc_count - self._free_count
        requested = self._requested_total - self._requested_freed
        return ArenaStatistics(
            capacity=self._capacity,
            requested_bytes=Count(requested, max(self._peak, requested), self._requested_total),
            allocated_bytes=self._initial_free - free,
            allocations=Count(live, live, self._alloc_count),
            inactive_split_bytes=free if live else 0,
            free_bytes=free,
            largest_free_bytes=strategy.largest_free(),
            free_extents=strategy.free_extent_count(),
            num_ooms=self._num_ooms,
        )

    def __repr__(self) -> str:
        return (
            f"Arena(capacity={format_size(self._capacity)}, base={self._base:#x}, "
            f"strategy={self._strategy.name}, requested={format_size(self.requested)}, "
            f"live={len(self)}, free={format_size(self._strategy.free_bytes())})"
        )

    # --- errors ----------------------------------------------------------------------------

    def _refused(self, nbytes: int, alignment: int) -> InvalidSizeError | OutOfMemoryError:
        """The error for a request the strategy refused: too large for any arena, or no room."""
        if nbytes > MAX_SIZE:
            return size_error(nbytes)
        self._num_ooms += 1
        return out_of_memory_error(
            nbytes,
            alignment,
            self._strategy,
            capacity=self._capacity,
            allocated=self.requested,
            initial_free=self._initial_free,
        )

    def _not_live(self, address: int) -> InvalidAddressError:
        """The error for ``address``, which is not live: a double free if it was freed among
        the last :attr:`recent_frees` frees, else an address never allocated here."""
        return not_live_error(
            address, self._recent_frees, self._recent_mask + 1, self._base, self._capacity
        )

    # --- invariants ------------------------------------------------------------------------

    def _check_invariants(self, level: int = EXPENSIVE) -> None:
        """Check the invariants of ``level`` (:data:`~tensorarena.debug.CHEAP`: the counters,
        O(1); :data:`~tensorarena.debug.EXPENSIVE`: every block and free extent, O(n log n));
        raise :class:`~tensorarena.errors.InvariantError` on the first broken one."""
        check_arena(self, level)
