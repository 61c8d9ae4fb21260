"""TLSF (two-level segregated fit): O(1) reserve and release through two levels of bitmaps.

After Masmano et al., "TLSF: a new dynamic memory allocator for real-time systems" (2004). Free
extents are binned by a first-level index ``fl`` (the power of two of their size) and a second-level
index ``sl`` that cuts each power of two into ``2**SL_BITS`` = 16 equal steps, so the extents of
one class differ in size by less than 1/16 (finer than segregated fit's quarters: a better fit
for more bit work). One bitmap says which first-level rows have any free extent and one bitmap
per row says which of its 16 classes do. Sizes below 32 have a class each (rows 0 and 1).

``reserve`` rounds the request up to the next class boundary (``mapping_search``), so any extent in
that class or a higher one is large enough; the lowest set bit of the row's bitmap above ``sl``,
or else of the first-level bitmap above ``fl`` then of that row's bitmap, names the class: a fixed
number of bit operations whatever the number of free extents. Within a class extents are popped
last-in first-out. The extent is split, the remainder binned; ``release`` merges the block with its
free neighbours through two boundary dicts (start → size, end → start) — the boundary tags of the
C original — and bins the result.

Two cases leave the O(1) path, as in the original's ``memalign``: an extent whose start is not
aligned is retried with the request padded by the alignment (again O(1)); and when the rounded-up
search finds nothing, the request's own class (whose extents may or may not be large enough) and
then the rest are scanned, so a request that fits somewhere is never refused.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["SL_BITS", "TLSF", "mapping_insert", "mapping_search"]

#: log2 of the number of second-level classes per power of two (the hot paths spell out the
#: arithmetic for this value: 4, 15, 16, 31).
SL_BITS = 4
_SL_COUNT = 1 << SL_BITS


def mapping_insert(nbytes: int) -> tuple[int, int]:
    """The class ``(fl, sl)`` whose range contains a free extent of ``nbytes``."""
    if nbytes < _SL_COUNT:
        return 0, nbytes
    e = nbytes.bit_length() - 1 - SL_BITS
    return e + 1, (nbytes >> e) - _SL_COUNT


def mapping_search(nbytes: int) -> tuple[int, int]:
    """The lowest class ``(fl, sl)`` all of whose extents hold ``nbytes`` (rounded up)."""
    if nbytes >= _SL_COUNT:
        nbytes += (1 << (nbytes.bit_length() - 1 - SL_BITS)) - 1
    return mapping_insert(nbytes)


def _class_floor(index: int) -> int:
    """The smallest size in the class at flat index ``index`` (= fl * 16 + sl)."""
    fl, sl = index >> SL_BITS, index & (_SL_COUNT - 1)
    return sl if fl == 0 else (_SL_COUNT + sl) << (fl - 1)


class TLSF:
    """Two-level segregated fit over ``[0, capacity)``: O(1) search, splitting and coalescing."""

    name: ClassVar[str] = "tlsf"
    coalesces: ClassVar[bool] = True

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        # One row past the capacity's own, so a rounded-up request that can fit has a row; a
        # larger one falls off the end and is refused by the IndexError handler.
        rows = mapping_insert(capacity)[0] + 2
        # Bins are one flat list indexed by fl * 16 + sl, which is also (e << 4) + (n >> e)
        # for e = (n | 31).bit_length() - 5: the size's top five bits plus 16 per power of two.
        self._bins: list[dict[int, int]] = [{} for _ in range(rows << SL_BITS)]
        self._floors = [_class_floor(index) for index in range((rows << SL_BITS) + 1)]
        self._fl_bitmap = 0
        self._sl_bitmaps: list[int] = [0] * rows
        self._size_at: dict[int, int] = {}
        self._start_of_end: dict[int, int] = {}
        self._free = 0
        self.reset()

    @property
    def capacity(self) -> int:
        """Size of the managed region in bytes."""
        return self._capacity

    def reset(self) -> None:
        """Forget every reservation: the whole region is one free extent again."""
        for bin_ in self._bins:
            bin_.clear()
        self._fl_bitmap = 0
        self._sl_bitmaps = [0] * len(self._sl_bitmaps)
        self._size_at = {}
        self._start_of_end = {}
        self._free = 0
        self._insert(0, self._capacity)

    def find_class(self, nbytes: int) -> tuple[int, int] | None:
        """The non-empty class ``reserve`` takes ``nbytes`` from, by bitmaps alone; or ``None``."""
        fl, sl = mapping_search(nbytes)
        if fl >= len(self._sl_bitmaps):
            return None
        sl_map = self._sl_bitmaps[fl] >> sl
        if sl_map:
            return fl, sl + (sl_map & -sl_map).bit_length() - 1
        fl_map = self._fl_bitmap >> (fl + 1)
        if not fl_map:
            return None
        fl += (fl_map & -fl_map).bit_length()
        sl_map = self._sl_bitmaps[fl]
        return fl, (sl_map & -sl_map).bit_length() - 1

    # --- hot paths -------------------------------------------------------------------------
    #
    # find_class, the class arithmetic and the bitmap upkeep are written out inline: a helper
    # call costs more than the arithmetic. A remainder that stays in its extent's class goes back
    # into the same bin, and a block that grows the free extent below it within that extent's
    # class updates it in place, so the bitmaps are left alone in the common cases.

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` from a class found in O(1); split off and bin the remainder."""
        e = (nbytes | 31).bit_length() - 5
        index = (e << 4) + ((nbytes + (1 << e) - 1) >> e)  # mapping_search, flattened
        fl = index >> 4
        sl = index & 15
        try:
            sl_map = self._sl_bitmaps[fl] >> sl
        except IndexError:
            return None  # larger than the region
        if sl_map:
            index += (sl_map & -sl_map).bit_length() - 1
        else:
            fl_map = self._fl_bitmap >> (fl + 1)
            if not fl_map:
                return self._reserve_slow(nbytes, alignment)
            fl += (fl_map & -fl_map).bit_length()
            sl_map = self._sl_bitmaps[fl]
            index = (fl << 4) + (sl_map & -sl_map).bit_length() - 1
        bin_ = self._bins[index]
        start, size = bin_.popitem()
        if start & (alignment - 1):
            bin_[start] = size
            return self._reserve_padded(nbytes, alignment)
        size_at = self._size_at
        del size_at[start]
        self._free -= nbytes
        rest = size - nbytes
        if rest:
            taken_end = start + nbytes
            size_at[taken_end] = rest
            self._start_of_end[taken_end + rest] = taken_end
            if rest >= self._floors[index]:
                bin_[taken_end] = rest  # still this class: same bin, bitmaps unchanged
                return start
            e = (rest | 31).bit_length() - 5
            rest_index = (e << 4) + (rest >> e)
            self._bins[rest_index][taken_end] = rest
            self._sl_bitmaps[rest_index >> 4] |= 1 << (rest_index & 15)
            self._fl_bitmap |= 1 << (rest_index >> 4)
        else:
            del self._start_of_end[start + size]
        if not bin_:
            fl = index >> 4
            sl_map = self._sl_bitmaps[fl] ^ (1 << (index & 15))
            self._sl_bitmaps[fl] = sl_map
            if not sl_map:
                self._fl_bitmap ^= 1 << fl
        return start

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merged with its free neighbours."""
        bins = self._bins
        size_at = self._size_at
        start_of_end = self._start_of_end
        self._free += nbytes
        end = offset + nbytes
        after = size_at.pop(end, None)
        if after is not None:
            e = (after | 31).bit_length() - 5
            index = (e << 4) + (after >> e)
            bin_ = bins[index]
            del bin_[end]
            if not bin_:
                self._empty(index)
            end += after
        before = start_of_end.pop(offset, None)
        if before is None:
            size = end - offset
        else:
            size = end - before
            below = offset - before
            e = (below | 31).bit_length() - 5
            index = (e << 4) + (below >> e)
            bin_ = bins[index]
            size_at[before] = size
            start_of_end[end] = before
            if size < self._floors[index + 1]:
                bin_[before] = size  # grown within its class: update in place
                return
            del bin_[before]
            if not bin_:
                self._empty(index)
            offset = before
        size_at[offset] = size
        start_of_end[end] = offset
        e = (size | 31).bit_length() - 5
        index = (e << 4) + (size >> e)
        bins[index][offset] = size
        self._sl_bitmaps[index >> 4] |= 1 << (index & 15)
        self._fl_bitmap |= 1 << (index >> 4)

    def _empty(self, index: int) -> None:
        """Clear the bitmap bits of a class whose bin just became empty."""
        fl = index >> 4
        sl_map = self._sl_bitmaps[fl] ^ (1 << (index & 15))
        self._sl_bitmaps[fl] = sl_map
        if not sl_map:
            self._fl_bitmap ^= 1 << fl

    # --- slow paths ------------------------------------------------------------------------

    def _reserve_padded(self, nbytes: int, alignment: int) -> int | None:
        """An unaligned extent came up: any of ``nbytes + alignment - 1`` bytes holds it aligned."""
        found = self.find_class(nbytes + alignment - 1)
        if found is None:
            return self._reserve_slow(nbytes, alignment)
        start, size = next(iter(self._bins[(found[0] << SL_BITS) + found[1]].items()))
        return self._carve(start, size, (start + alignment - 1) & -alignment, nbytes)

    def _reserve_slow(self, nbytes: int, alignment: int) -> int | None:
        """Scan the request's own class, then every larger one, for an aligned fit."""
        if nbytes > self._free:
            return None
        mask = alignment - 1
        fl, sl = mapping_insert(nbytes)
        for index in range((fl << SL_BITS) + sl, len(self._bins)):
            for start, size in self._bins[index].items():
                offset = (start + mask) & ~mask
                if offset + nbytes <= start + size:
                    return self._carve(start, size, offset, nbytes)
        return None

    def _carve(self, start: int, size: int, offset: int, nbytes: int) -> int:
        """Take ``[offset, offset + nbytes)`` out of the free extent ``[start, start + size)``."""
        fl, sl = mapping_insert(size)
        index = (fl << SL_BITS) + sl
        bin_ = self._bins[index]
        del bin_[start]
        if not bin_:
            self._empty(index)
        del self._size_at[start]
        del self._start_of_end[start + size]
        self._free -= size
        if offset > start:
            self._insert(start, offset - start)
        if offset + nbytes < start + size:
            self._insert(offset + nbytes, start + size - offset - nbytes)
        return offset

    def _insert(self, start: int, size: int) -> None:
        """Add the free extent ``[start, start + size)`` (no merging; counts its bytes)."""
        fl, sl = mapping_insert(size)
        self._bins[(fl << SL_BITS) + sl][start] = size
        self._sl_bitmaps[fl] |= 1 << sl
        self._fl_bitmap |= 1 << fl
        self._size_at[start] = size
        self._start_of_end[start + size] = start
        self._free += size

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none): the top class's largest member."""
        if not self._fl_bitmap:
            return 0
        fl = self._fl_bitmap.bit_length() - 1
        sl = self._sl_bitmaps[fl].bit_length() - 1
        return max(self._bins[(fl << SL_BITS) + sl].values())

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return len(self._size_at)

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset."""
        return sorted(self._size_at.items())

    def __repr__(self) -> str:
        return (
            f"TLSF(capacity={self._capacity}, free={self._free}, "
            f"extents={len(self._size_at)})"
        )
