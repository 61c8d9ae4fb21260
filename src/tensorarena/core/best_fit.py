"""Best fit: the smallest free extent that can hold the request (lowest address on ties).

Free extents are kept twice, in flat lists of ints and no dict. By address: two parallel lists,
``starts`` (sorted) and ``sizes``, ended by a sentinel extent of size 0 at ``capacity + 1`` (as
in :mod:`tensorarena.core._address_ordered`), so one bisection finds both neighbours of a
released block. By size: integer keys ``size << shift | start`` (ints compare faster than tuples
and cost no allocation), sorted, in one *bin* per bit length of the size. Within a bin, one
bisection finds the smallest extent of at least ``nbytes`` and ties go to the lowest start; when
the request's own bin holds none, every extent of a larger bin fits and the smallest is the
first key of the lowest non-empty bin above, found from a bitmap of the non-empty bins. Bins hold
a few keys each, so their bisections take 2-3 steps and their memmoves are short, where one list
of every key took several more steps and moved hundreds of items (compiled: a visible share of
a pair).

A reservation is a bisection in its bin, one by address (to update the extent) and the rest's
key put back; a release is one bisection by address, at most two keys removed and one inserted
(boundary dicts cost 6-9 dict operations a pair; interpreted, the bisections are a little slower).

The compiled build (see ``setup.py``) keeps the same lists and keys in packed 64-bit arrays
(:mod:`tensorarena.core._packed_best_fit`, the same steps on ``vec[i64]``) whenever its keys fit
62 bits, and the Python lists below otherwise; the pure build always keeps the lists.

Granules: every free extent's start and size is a multiple of ``granule`` = ``2**g`` bytes (256,
the arena's default alignment, or less when the capacity or a request is not a multiple of it),
and the lists count in those units, so the keys fit in 62 bits for capacities up to 2^39 bytes
(``bench alloc``'s arena is 2^34). A request whose size is not a multiple of the granule refines
it first: every list is rebuilt in the finer unit (O(n log n), once; ``reset`` restores the
initial granule). The order of the extents and keys, and so every placement, is the same in
any unit.

Alignment: the keys are scanned upward (through the bins in order) from the first large-enough
extent until one holds the request at an aligned offset, so the result is the smallest extent
that fits *aligned*. Requests whose size is a multiple of every alignment in play (the usual
case) stop at the first key.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from itertools import pairwise
from typing import ClassVar, Final

from tensorarena.core import _bisect
from tensorarena.core._arena_errors import size_error
from tensorarena.core._bisect import COMPILED
from tensorarena.core._builtin import BuiltinStrategy
from tensorarena.core._packed_best_fit import MAX_SHIFT, PackedBestFit
from tensorarena.debug import check

__all__ = ["BestFit"]

# Final names: the compiled build (see setup.py) keeps them in C statics instead of looking them
# up in the module's namespace at every call. It searches with _bisect's loops, compiled with this
# module and called directly (~10 % of a pair less); the pure build with the bisect module.
_bisect_left: Final = bisect_left
_insort: Final = insort
#: The coarsest granule, as a power of two: the arena's default alignment (256 bytes).
GRANULE_SHIFT: Final = 8


def _trailing_zeros(n: int) -> int:
    """The exponent of the largest power of two dividing ``n`` (``n`` > 0)."""
    return (n & -n).bit_length() - 1


def _by_size(extent: tuple[int, int]) -> tuple[int, int]:
    return extent[1], extent[0]


class BestFit(BuiltinStrategy):
    """Best-fit placement over ``[0, capacity)`` with splitting and coalescing, O(log n) search."""

    name: ClassVar[str] = "best_fit"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._initial_g = min(_trailing_zeros(capacity), GRANULE_SHIFT) if capacity else 0
        self._g = 0  # the granule is 2**_g bytes
        self._granule_mask = 0
        self._shift = 0  # a key is size << _shift | start, in granules
        self._start_mask = 0
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self._bins: list[list[int]] = []  # bin c: sorted keys of the sizes of bit length c
        self._nonempty = 0  # bit c set when bin c holds a key
        self._free = 0
        # Compiled, the same state in packed arrays (the lists above are then left empty).
        self._packed: PackedBestFit | None = None
        self.reset()

    @property
    def capacity(self) -> int:
        """Size of the managed region in bytes."""
        return self._capacity

    @property
    def granule(self) -> int:
        """The unit of the lists in bytes: every free offset and size is a multiple of it."""
        return 1 << self._g

    def reset(self) -> None:
        """Forget every reservation: the whole region is one free extent again."""
        self._set_granule(self._initial_g)
        top = self._capacity >> self._g
        self._starts = [0, top + 1]
        self._sizes = [top, 0]
        self._bins = [[] for _ in range(self._shift + 1)]
        self._nonempty = 0
        if top:
            self._bins[top.bit_length()].append(top << self._shift)
            self._nonempty = 1 << top.bit_length()
        self._free = self._capacity
        self._pack()

    def _pack(self) -> None:
        """Compiled, move the state into packed arrays when its keys fit 64 bits."""
        self._packed = None
        if COMPILED and self._shift <= MAX_SHIFT:
            state = self._starts, self._sizes, self._bins, self._nonempty, self._free
            self._packed = PackedBestFit(self._g, self._shift, *state)
            self._starts, self._sizes, self._bins = [], [], []

    def _unpack(self) -> None:
        """Move a packed state back into the lists."""
        packed = self._packed
        if packed is not None:
            self._starts, self._sizes, self._bins, self._nonempty, self._free = packed.state()
            self._packed = None

    # --- hot paths -------------------------------------------------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` from the smallest free extent that holds them aligned."""
        if nbytes <= 0:  # called directly, not through an Arena: refuse, change nothing
            raise size_error(nbytes)
        if nbytes & self._granule_mask:
            if nbytes > self._capacity:
                return None  # refused as it is, without refining the granule
            self._refine_granule(_trailing_zeros(nbytes))
        packed = self._packed
        if packed is not None:
            return packed.reserve(nbytes, alignment)
        shift = self._shift
        g = self._g
        n = nbytes >> g
        c = n.bit_length()
        try:
            keys = self._bins[c]
        except IndexError:
            return None  # larger than the region
        wanted = n << shift
        i = _bisect.bisect_left(keys, wanted) if COMPILED else _bisect_left(keys, wanted)
        if i == len(keys):
            # Every extent of a larger bit length fits: the smallest is the first key of the
            # lowest non-empty bin above.
            above = self._nonempty >> (c + 1)
            if not above:
                return None
            c += (above & -above).bit_length()
            keys = self._bins[c]
            i = 0
        key = keys[i]
        start = key & self._start_mask
        if (start << g) & (alignment - 1):
            return self._reserve_aligned(c, i, n, alignment)
        # Common case: the extent is aligned, take its bottom and give the rest back.
        starts = self._starts
        p = _bisect.bisect_left(starts, start) if COMPILED else _bisect_left(starts, start)
        self._free -= nbytes
        rest = (key >> shift) - n
        if rest:
            taken_end = start + n
            starts[p] = taken_end
            self._sizes[p] = rest
            key = rest << shift | taken_end
            r = rest.bit_length()
            if r == c:
                # The same bin, below the extent's key: often at its very place.
                if COMPILED:
                    j = _bisect.bisect_left_in(keys, key, 0, i)
                else:
                    j = _bisect_left(keys, key, 0, i)
                if j == i:
                    keys[i] = key
                else:
                    del keys[i]
                    keys.insert(j, key)
                return start << g
            rest_keys = self._bins[r]  # a lower bin, inline as in release
            _bisect.insort(rest_keys, key) if COMPILED else _insort(rest_keys, key)
            self._nonempty |= 1 << r
        else:
            del starts[p]
            del self._sizes[p]
        del keys[i]
        if not keys:
            self._nonempty ^= 1 << c
        return start << g

    def _reserve_aligned(self, c: int, i: int, n: int, alignment: int) -> int | None:
        """Slow path: walk keys by size until one holds ``n`` granules at an aligned offset."""
        shift = self._shift
        g = self._g
        start_mask = self._start_mask
        mask = alignment - 1
        bins = self._bins
        found = False
        start = size = offset = 0
        keys = bins[c]
        while c < len(bins):
            keys = bins[c]
            while i < len(keys):
                key = keys[i]
                start = key & start_mask
                size = key >> shift
                # An alignment below a granule holds at every start: the gap is whole granules.
                offset = (((start << g) + mask) & ~mask) >> g
                if offset + n <= start + size:
                    found = True
                    break
                i += 1
            if found:
                break
            c += 1
            i = 0
        if not found:
            return None
        del keys[i]
        if not keys:
            self._nonempty ^= 1 << c
        starts = self._starts
        sizes = self._sizes
        p = _bisect.bisect_left(starts, start) if COMPILED else _bisect_left(starts, start)
        self._free -= n << g
        taken_end = offset + n
        rest = start + size - taken_end
        if offset > start:  # the alignment gap stays free
            sizes[p] = offset - start
            self._add_key((offset - start).bit_length(), (offset - start) << shift | start)
            if rest:
                starts.insert(p + 1, taken_end)
                sizes.insert(p + 1, rest)
        elif rest:
            starts[p] = taken_end
            sizes[p] = rest
        else:
            del starts[p]
            del sizes[p]
        if rest:
            self._add_key(rest.bit_length(), rest << shift | taken_end)
        return offset << g

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merging it with free neighbours."""
        packed = self._packed
        if packed is not None:
            packed.release(offset, nbytes)
            return
        g = self._g
        shift = self._shift
        start = offset >> g
        size = nbytes >> g
        end = start + size
        starts = self._starts
        sizes = self._sizes
        self._free += nbytes
        # The first free extent above the block; the sentinel guarantees there is one, and
        # starts[-1] (the sentinel) stands in for "no extent below" when p == 0.
        p = _bisect.bisect_left(starts, start) if COMPILED else _bisect_left(starts, start)
        below = p - 1
        below_start = starts[below]
        below_size = sizes[below]
        # A merged neighbour's key leaves its bin (inline: a method call costs the pure build
        # more than the bisection itself).
        if below_start + below_size == start:
            start = below_start
            keys = self._bins[below_size.bit_length()]
            key = below_size << shift | start
            del keys[_bisect.bisect_left(keys, key) if COMPILED else _bisect_left(keys, key)]
            if not keys:
                self._nonempty ^= 1 << below_size.bit_length()
            size += below_size
            if starts[p] == end:
                self._drop_key(sizes[p], end)
                size += sizes[p]
                del starts[p]
                del sizes[p]
            sizes[below] = size
        elif starts[p] == end:
            above_size = sizes[p]
            keys = self._bins[above_size.bit_length()]
            key = above_size << shift | end
            del keys[_bisect.bisect_left(keys, key) if COMPILED else _bisect_left(keys, key)]
            if not keys:
                self._nonempty ^= 1 << above_size.bit_length()
            size += above_size
            starts[p] = start
            sizes[p] = size
        else:
            starts.insert(p, start)
            sizes.insert(p, size)
        c = size.bit_length()
        keys = self._bins[c]
        key = size << shift | start
        _bisect.insort(keys, key) if COMPILED else _insort(keys, key)
        self._nonempty |= 1 << c

    def _add_key(self, c: int, key: int) -> None:
        """Insert ``key`` into bin ``c`` (its size's bit length)."""
        keys = self._bins[c]
        _bisect.insort(keys, key) if COMPILED else _insort(keys, key)
        self._nonempty |= 1 << c

    def _drop_key(self, size: int, start: int) -> None:
        """Remove the key of the free extent ``[start, start + size)``."""
        c = size.bit_length()
        keys = self._bins[c]
        key = size << self._shift | start
        del keys[_bisect.bisect_left(keys, key) if COMPILED else _bisect_left(keys, key)]
        if not keys:
            self._nonempty ^= 1 << c

    # --- granules --------------------------------------------------------------------------

    def _set_granule(self, g: int) -> None:
        self._g = g
        self._granule_mask = (1 << g) - 1
        self._shift = (self._capacity >> g).bit_length()
        self._start_mask = (1 << self._shift) - 1

    def _refine_granule(self, g: int) -> None:
        """Count in the finer unit ``2**g`` bytes, for a request that is not a multiple of the
        present one; the extents and their order stay as they are."""
        self._unpack()
        finer = self._g - g
        self._set_granule(g)
        self._starts = [start << finer for start in self._starts[:-1]]
        self._sizes = [size << finer for size in self._sizes[:-1]]
        shift = self._shift
        self._bins = [[] for _ in range(shift + 1)]
        self._nonempty = 0
        for start, size in sorted(zip(self._starts, self._sizes, strict=True), key=_by_size):
            self._bins[size.bit_length()].append(size << shift | start)
            self._nonempty |= 1 << size.bit_length()
        self._starts.append((self._capacity >> g) + 1)
        self._sizes.append(0)
        self._pack()

    # --- queries ---------------------------------------------------------------------------

    def _state(self) -> tuple[list[int], list[int], list[list[int]], int, int]:
        """``(starts, sizes, bins, nonempty, free)``: the lists, or a copy of the packed state."""
        packed = self._packed
        if packed is not None:
            return packed.state()
        return self._starts, self._sizes, self._bins, self._nonempty, self._free

    def free_bytes(self) -> int:
        """Total free bytes."""
        packed = self._packed
        return self._free if packed is None else packed.free_bytes()

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none)."""
        packed = self._packed
        if packed is not None:
            return packed.largest_free()
        nonempty = self._nonempty
        if not nonempty:
            return 0
        return (self._bins[nonempty.bit_length() - 1][-1] >> self._shift) << self._g

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        packed = self._packed
        return len(self._starts) - 1 if packed is None else packed.free_extent_count()

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset."""
        g = self._g
        starts, sizes, _, _, _ = self._state()
        extents = zip(starts[:-1], sizes[:-1], strict=True)
        return [(start << g, size << g) for start, size in extents]

    def _check_invariants(self) -> None:
        """Check that the size index mirrors the address lists; raise
        :class:`~tensorarena.errors.InvariantError` otherwise. O(n log n): for tests and debug."""
        all_starts, all_sizes, bins, nonempty, free = self._state()
        starts = all_starts[:-1]
        sizes = all_sizes[:-1]
        check(all_starts[-1] == (self._capacity >> self._g) + 1, "the sentinel moved")
        check(all_sizes[-1] == 0, "the sentinel is not empty")
        check(all(a < b for a, b in pairwise(starts)), "starts are not sorted")
        check(all(size > 0 for size in sizes), "an empty free extent is listed")
        shift = self._shift
        expected = sorted(size << shift | start for start, size in zip(starts, sizes, strict=True))
        keys = [key for keys in bins for key in keys]
        check(keys == expected, "the size index disagrees with the address lists")
        for c, keys in enumerate(bins):
            check(all((key >> shift).bit_length() == c for key in keys), f"bin {c} is mixed")
            check(bool(keys) == bool(nonempty >> c & 1), f"bin {c}'s bit is wrong")
        check(free == sum(sizes) << self._g, "free bytes disagree with the extents")

    def __repr__(self) -> str:
        extents = self.free_extent_count()
        free = self.free_bytes()
        return f"BestFit(capacity={self._capacity}, free={free}, extents={extents})"
