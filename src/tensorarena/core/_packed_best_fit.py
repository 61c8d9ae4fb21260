"""Best fit's free extents in packed native arrays: the compiled build's representation.

:class:`~tensorarena.core.best_fit.BestFit` keeps its address lists and size bins in Python
lists of ints: every item is a separate int object, so a bisection dereferences a pointer and
then an object that may sit anywhere in memory, and every store boxes a new one. Compiled (see
``setup.py``), it keeps them here instead, in ``vec[i64]`` from mypyc's runtime library
(``librt.vecs``): contiguous 64-bit integers, read and written natively. The algorithm, the
granules and the keys are :mod:`tensorarena.core.best_fit`'s, step for step, so every placement
is the same; only the containers differ. On ``bench alloc`` a best-fit pair costs fewer
instructions, far fewer L1 data-cache read misses (callgrind) and less time
(``bench/RESULTS.md``).

A key ``size << shift | start`` must fit a signed 64-bit integer: ``BestFit`` packs its state
only while ``2 * shift <= 62`` (capacities up to 2^31 granules) and keeps Python lists beyond
(an odd request that refines the granule of a large arena may take it there). The pure build
never imports ``librt``: the names below exist for the type checker and mypyc alone, and this
module's class is only built when :data:`~tensorarena.core._bisect.COMPILED` is true.

The address arrays run *downward* (the sentinel first), as in
:mod:`tensorarena.core._packed_first_fit`: an insertion moves the items after it one at a time
(librt has no insert), and on ``bench alloc`` a released block has a median of 48 free extents
below it and 103 above.

A ``vec`` is a value: ``append`` and ``pop`` return the vec to keep (its buffer may move), so
every insertion and deletion stores the result back, in the object or in its bin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # compiled to native operations; nothing is imported at run time
    from librt.vecs import append, vec
    from mypy_extensions import i64

from tensorarena.core._packed_vec import bit_length as _bit_length
from tensorarena.core._packed_vec import count_at_least as _count_at_least
from tensorarena.core._packed_vec import delete as _delete
from tensorarena.core._packed_vec import insert as _insert

__all__ = ["MAX_SHIFT", "PackedBestFit"]

#: The largest ``shift`` whose keys (``size << shift | start``, both below ``2**shift``) fit.
MAX_SHIFT = 31


def _bisect(keys: vec[i64], key: i64, hi: i64) -> i64:
    """The first index below ``hi`` whose key is not below ``key`` (branch-free, as _bisect)."""
    lo: i64 = 0
    n = hi
    if n <= 0:
        return 0
    while n > 1:
        half = n >> 1
        if keys[lo + half] < key:
            lo += half
        n -= half
    if keys[lo] < key:
        lo += 1
    return lo


def _insort(keys: vec[i64], key: i64) -> vec[i64]:
    """``keys`` with ``key`` inserted after any equal keys, still sorted."""
    n: i64 = len(keys)
    base: i64 = 0
    if n:
        while n > 1:
            half = n >> 1
            if not key < keys[base + half]:
                base += half
            n -= half
        if not key < keys[base]:
            base += 1
    return _insert(keys, base, key)


class PackedBestFit:
    """Best fit's free extents (in granules of ``2**g`` bytes) in packed arrays; see
    :class:`~tensorarena.core.best_fit.BestFit` for the algorithm and its invariants."""

    def __init__(
        self,
        g: i64,
        shift: i64,
        starts: list[int],
        sizes: list[int],
        bins: list[list[int]],
        nonempty: int,
        free: int,
    ) -> None:
        self._g = g
        self._shift = shift
        self._start_mask: i64 = (1 << shift) - 1
        # Every size of ``shift`` bits or fewer (in granules) fits an i64; nothing larger fits.
        self._largest = int(self._start_mask << g)
        self._starts = vec[i64](starts[::-1])  # downward in address, the sentinel first
        self._sizes = vec[i64](sizes[::-1])
        packed = vec[vec[i64]]()
        for keys in bins:
            packed = append(packed, vec[i64](keys))
        self._bins = packed
        self._nonempty: i64 = nonempty
        self._free = free

    def state(self) -> tuple[list[int], list[int], list[list[int]], int, int]:
        """``(starts, sizes, bins, nonempty, free)`` as Python lists, as ``BestFit`` keeps them."""
        bins = [list(keys) for keys in self._bins]
        starts, sizes = list(self._starts)[::-1], list(self._sizes)[::-1]
        return starts, sizes, bins, self._nonempty, self._free

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free extent in bytes (0 when none)."""
        if not self._nonempty:
            return 0
        keys = self._bins[_bit_length(self._nonempty) - 1]
        return int((keys[len(keys) - 1] >> self._shift) << self._g)

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return len(self._starts) - 1

    # --- hot paths (BestFit.reserve and release, on vecs) ----------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """``BestFit.reserve`` for a positive ``nbytes``, a multiple of the granule."""
        shift = self._shift
        g = self._g
        bins = self._bins
        if nbytes > self._largest:
            return None  # larger than the region (and than an i64 may hold)
        n: i64 = nbytes >> g
        c = _bit_length(n)
        if c >= len(bins):
            return None  # larger than the region
        keys = bins[c]
        wanted = n << shift
        i = _bisect(keys, wanted, len(keys))
        if i == len(keys):
            above = self._nonempty >> (c + 1)
            if not above:
                return None
            c += _bit_length(above & -above)
            keys = bins[c]
            i = 0
        key = keys[i]
        start = key & self._start_mask
        if (start << g) & (alignment - 1):
            return self._reserve_aligned(c, i, n, alignment)
        starts = self._starts
        p = _count_at_least(starts, start) - 1  # the extent itself
        self._free -= nbytes
        rest = (key >> shift) - n
        if rest:
            taken_end = start + n
            starts[p] = taken_end
            self._sizes[p] = rest
            key = rest << shift | taken_end
            r = _bit_length(rest)
            if r == c:
                # The same bin, below the extent's key: often at its very place.
                j = _bisect(keys, key, i)
                while i > j:  # shift the keys between up by one (in place, no allocation)
                    keys[i] = keys[i - 1]
                    i -= 1
                keys[j] = key
                return int(start << g)
            bins[r] = _insort(bins[r], key)
            self._nonempty |= 1 << r
        else:
            self._starts = _delete(starts, p)
            self._sizes = _delete(self._sizes, p)
        keys = _delete(keys, i)
        bins[c] = keys
        if not len(keys):
            self._nonempty ^= 1 << c
        return int(start << g)

    def _reserve_aligned(self, c: i64, i: i64, n: i64, alignment: int) -> int | None:
        """Slow path: walk keys by size until one holds ``n`` granules at an aligned offset."""
        shift = self._shift
        g = self._g
        start_mask = self._start_mask
        mask: i64 = alignment - 1
        bins = self._bins
        found = False
        start: i64 = 0
        size: i64 = 0
        offset: i64 = 0
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
        keys = _delete(keys, i)
        bins[c] = keys
        if not len(keys):
            self._nonempty ^= 1 << c
        starts = self._starts
        sizes = self._sizes
        p = _count_at_least(starts, start) - 1  # the extent itself
        self._free -= n << g
        taken_end = offset + n
        rest = start + size - taken_end
        if offset > start:  # the alignment gap stays free
            sizes[p] = offset - start
            self._add_key((offset - start) << shift | start)
            if rest:
                self._starts = _insert(starts, p, taken_end)  # above the gap: before it
                self._sizes = _insert(sizes, p, rest)
        elif rest:
            starts[p] = taken_end
            sizes[p] = rest
        else:
            self._starts = _delete(starts, p)
            self._sizes = _delete(sizes, p)
        if rest:
            self._add_key(rest << shift | taken_end)
        return int(offset << g)

    def release(self, offset: int, nbytes: int) -> None:
        """``BestFit.release``: give back ``[offset, offset + nbytes)``, merging neighbours."""
        g = self._g
        start: i64 = offset >> g
        size: i64 = nbytes >> g
        end = start + size
        starts = self._starts
        sizes = self._sizes
        self._free += nbytes
        # Items before p start at or above the block: p - 1 is the first free extent above it
        # (the sentinel at worst), p the one below it; the sentinel stands in for "no extent
        # below" when there is none.
        p = _count_at_least(starts, start)
        above = p - 1
        below: i64 = 0  # not a conditional expression: mypyc would box it
        if p < len(starts):
            below = p
        below_start = starts[below]
        below_size = sizes[below]
        if below_start + below_size == start:
            start = below_start
            self._drop_key(below_size, start)
            size += below_size
            if starts[above] == end:
                above_size = sizes[above]
                self._drop_key(above_size, end)
                size += above_size
                self._starts = _delete(starts, above)
                sizes = _delete(sizes, above)
                self._sizes = sizes
                below = above  # the extent below moved down one place
            sizes[below] = size
        elif starts[above] == end:
            above_size = sizes[above]
            self._drop_key(above_size, end)
            size += above_size
            starts[above] = start
            sizes[above] = size
        else:
            self._starts = _insert(starts, p, start)
            self._sizes = _insert(sizes, p, size)
        self._add_key(size << self._shift | start)

    def _add_key(self, key: i64) -> None:
        """Insert ``key`` into the bin of its size's bit length."""
        c = _bit_length(key >> self._shift)
        bins = self._bins
        bins[c] = _insort(bins[c], key)
        self._nonempty |= 1 << c

    def _drop_key(self, size: i64, start: i64) -> None:
        """Remove the key of the free extent ``[start, start + size)``."""
        c = _bit_length(size)
        bins = self._bins
        keys = bins[c]
        key = size << self._shift | start
        keys = _delete(keys, _bisect(keys, key, len(keys)))
        bins[c] = keys
        if not len(keys):
            self._nonempty ^= 1 << c
