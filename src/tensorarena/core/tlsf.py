"""TLSF (two-level segregated fit): O(1) reserve and release through a bitmap of size classes.

After Masmano et al., "TLSF: a new dynamic memory allocator for real-time systems" (2004). Free
extents are binned by a first-level index ``fl`` (the power of two of their size) and a second-level
index ``sl`` that cuts each power of two into ``2**SL_BITS`` = 16 equal steps, so the extents of
one class differ in size by less than 1/16 (finer than segregated fit's quarters: a better fit).
Sizes below 32 have a class each (rows 0 and 1).

``reserve`` rounds the request up to the next class boundary (``mapping_search``), so any extent in
that class or a higher one is large enough, and the lowest non-empty class from there is found
with a fixed number of bit operations whatever the number of free extents. Within a class extents
are popped last-in first-out. The extent is split, the remainder binned; ``release`` merges the
block with its free neighbours, found through the chain of blocks in address order (the boundary
tags of the C original), and bins the result.

The bitmaps are the original's two levels of words: one first-level word with a bit per
non-empty row ``fl``, and per row a word with a bit per non-empty class ``sl`` (16 bits), so the
search is ``(sl_map >> sl)``, else ``(fl_map >> fl + 1)`` then that row's word, each a lowest set
bit. Classes are numbered flat (``fl * 16 + sl``, the same numbers as ``mapping_insert``'s pair)
so that TLSF shares its engine, and its hot paths, with segregated fit
(:mod:`tensorarena.core._segregated`, which is the same machinery at four classes per power of
two, and describes the layout).

Two cases leave the O(1) path, as in the original's ``memalign``: an extent whose start is not
aligned is retried with the request padded by the alignment (again O(1)); and when the rounded-up
search finds nothing, the request's own class (whose extents may or may not be large enough) and
then the rest are scanned, so a request that fits somewhere is never refused.
"""

from __future__ import annotations

from typing import ClassVar, Final

from tensorarena.core._segregated import SegregatedExtents, search_class

__all__ = ["SL_BITS", "TLSF", "mapping_insert", "mapping_search"]

#: log2 of the number of second-level classes per power of two.
SL_BITS: Final = 4
_SL_COUNT: Final = 1 << SL_BITS


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


class TLSF(SegregatedExtents):
    """Two-level segregated fit over ``[0, capacity)``: O(1) search, splitting and coalescing."""

    name: ClassVar[str] = "tlsf"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes
    # The engine's flat class index is fl * 16 + sl: the size's top five bits plus 16 per power
    # of two, the same numbers as mapping_insert's pair.
    _SL_BITS = SL_BITS

    def find_class(self, nbytes: int) -> tuple[int, int] | None:
        """The non-empty class ``reserve`` takes ``nbytes`` from, by the bitmaps alone, or None."""
        index = search_class(nbytes, SL_BITS)
        if index >= self._classes:
            return None
        index = self._nonempty_from(index)
        if index < 0:
            return None
        return index >> SL_BITS, index & (_SL_COUNT - 1)

    def _reserve_misaligned(self, nbytes: int, alignment: int) -> int | None:
        """An unaligned extent came up: any of ``nbytes + alignment - 1`` bytes holds it aligned."""
        self._check_alignment(alignment)
        padded = nbytes + alignment - 1
        index = search_class(padded, SL_BITS)
        if index < self._classes:
            index = self._nonempty_from(index)
            if index >= 0:
                block = self._heads[index]
                if block is not None:
                    offset = (block.start + alignment - 1) & -alignment
                    return self._carve(block, offset, nbytes)
        return self._reserve_slow(nbytes, alignment)
