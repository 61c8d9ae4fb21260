"""Segregated free lists: the engine shared by segregated fit and TLSF.

Free extents are binned by size class. A power of two is cut into ``2**sl_bits`` equal steps
(segregated fit: 4, TLSF: 16), sizes below ``2 << sl_bits`` have a class each, and the class
index is flat: ``(e << sl_bits) + (n >> e)`` with ``e = (n | (2 << sl_bits) - 1).bit_length() -
sl_bits - 1``. Each class holds its free extents in a dict (start → size, popped last-in first-out,
which keeps recently freed memory warm), and one integer bitmap marks the non-empty classes:
Python's ints have no word size, so one bitmap does what the two levels of TLSF's C original do
(the lowest set bit of ``bitmap >> class`` is one C-level scan of a few machine words).

``reserve`` rounds the request *up* to a class boundary: every extent in that class or above is
large enough, so the lowest set bit of ``bitmap >> class`` names the bin to pop from, in O(1).
The extent is split, the remainder binned; ``release`` merges the block with its free neighbours
through two boundary dicts (start → size, end → start) and bins the result, so freeing everything
restores one extent. What the engine cannot serve in O(1) (nothing large enough in the classes
that surely fit, or an extent that is not aligned) goes to a slow path that scans the request's
own class and the larger ones; TLSF first retries a misaligned request padded, in O(1).

Written for the interpreter, where an int operation costs ~15 ns and a method call more:

* Class indices come from tables, not arithmetic: by the size itself up to ``_SMALL`` bytes, and
  above it by ``size >> 8`` up to ``_BIG_LIMIT`` (exact there, because every class floor above
  4 KiB is a multiple of 256 when a power of two has at most 16 classes). Only larger sizes pay for
  the arithmetic. The tables are built on first use, once per ``sl_bits``, and shared (~340 KB
  and ~16 ms each).
* The bit of each class is looked up too (``self._bits[cls]``) rather than shifted out.
* A remainder that stays in its extent's class goes back into the same bin, and a released block
  that grows the free extent below it within that extent's class updates it in place, so the
  bitmap is left alone in the common cases.

Compiled build (see ``setup.py``): an ``int`` local is an unboxed C integer there, boxed anew (an
allocation) at each dict operation it takes part in, so ``reserve`` and ``release`` name the ints
they store twice, ``end`` and ``end_obj: Any``, and the ``Any`` twin is boxed once and reused
(~15 % of a pair, measured). Interpreted, both names hold the same object.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final

from tensorarena.core._builtin import BuiltinStrategy

__all__ = ["SegregatedExtents", "bin_class", "floor_of_class", "search_class"]

# Final: the compiled build (see setup.py) inlines them instead of looking them up by name.
#: Sizes up to this many bytes find their class in a table indexed by the size itself.
_SMALL: Final = 4096
#: Sizes up to this many bytes find their class in a table indexed by ``size >> 8``.
_BIG_LIMIT: Final = 1 << 22


def bin_class(nbytes: int, sl_bits: int) -> int:
    """The class whose range contains a free extent of ``nbytes``."""
    e = (nbytes | ((2 << sl_bits) - 1)).bit_length() - sl_bits - 1
    return (e << sl_bits) + (nbytes >> e)


def search_class(nbytes: int, sl_bits: int) -> int:
    """The lowest class all of whose extents hold ``nbytes``: ``nbytes`` rounded up to a floor."""
    e = (nbytes | ((2 << sl_bits) - 1)).bit_length() - sl_bits - 1
    return (e << sl_bits) + ((nbytes + (1 << e) - 1) >> e)


def floor_of_class(cls: int, sl_bits: int) -> int:
    """The smallest size in class ``cls``."""
    if cls < 2 << sl_bits:
        return cls
    step = 1 << sl_bits
    return (step | (cls & (step - 1))) << ((cls >> sl_bits) - 1)


@cache
def _tables(sl_bits: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """(search by size, bin by size, search by (size - 1) >> 8, bin by size >> 8)."""
    search_small = [search_class(n, sl_bits) if n else 0 for n in range(_SMALL + 1)]
    bin_small = [bin_class(n, sl_bits) if n else 0 for n in range(_SMALL + 1)]
    search_big = [search_class((i + 1) << 8, sl_bits) for i in range(_BIG_LIMIT >> 8)]
    bin_big = [bin_class(i << 8, sl_bits) for i in range(_BIG_LIMIT >> 8)]
    return search_small, bin_small, search_big, bin_big


class SegregatedExtents(BuiltinStrategy):
    """Size-class free lists over ``[0, capacity)``; subclasses choose ``_SL_BITS``."""

    #: log2 of the number of classes per power of two.
    _SL_BITS: int = 2

    def __init__(self, capacity: int) -> None:
        sl_bits = self._SL_BITS
        # Instance attributes: CPython 3.11 specialises their loads, not those of class ones.
        self._sl_bits = sl_bits
        self._e_bias = sl_bits + 1
        self._capacity = capacity
        self._search_small, self._bin_small, self._search_big, self._bin_big = _tables(sl_bits)
        # One class past the capacity's own, so a rounded-up request that can fit has a bin; a
        # larger one falls off the end of the list and is refused by the IndexError handler.
        classes = bin_class(capacity, sl_bits) + 2
        self._bins: list[dict[int, int]] = [{} for _ in range(classes)]
        self._floors = [floor_of_class(cls, sl_bits) for cls in range(classes + 1)]
        self._bits = [1 << cls for cls in range(classes)]
        self._bitmap = 0
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
        self._size_at = {}
        self._start_of_end = {}
        self._bitmap = 0
        self._free = 0
        self._insert(0, self._capacity)

    # --- hot paths -------------------------------------------------------------------------
    #
    # The class lookups are written out inline (a helper call would cost more than the lookup):
    # ``t_small[n] if n <= _SMALL else t_big[n >> 8] if n < _BIG_LIMIT else <arithmetic>``, the
    # arithmetic being bin_class's without the ``| mask`` that only sizes below 32 need.

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` from the lowest non-empty class that surely holds them."""
        if nbytes <= _SMALL:
            cls = self._search_small[nbytes]
        elif nbytes <= _BIG_LIMIT:
            cls = self._search_big[(nbytes - 1) >> 8]
        else:
            e = nbytes.bit_length() - self._e_bias
            cls = (e << self._sl_bits) + ((nbytes + (1 << e) - 1) >> e)
        try:
            bin_ = self._bins[cls]
        except IndexError:
            return None  # larger than the region
        if not bin_:
            m = self._bitmap >> cls
            if not m:
                return self._reserve_slow(nbytes, alignment)
            cls += (m & -m).bit_length() - 1
            bin_ = self._bins[cls]
        start, size = bin_.popitem()
        if start & (alignment - 1):
            bin_[start] = size
            return self._reserve_misaligned(nbytes, alignment)
        size_at = self._size_at
        del size_at[start]
        self._free -= nbytes
        rest = size - nbytes
        if rest:
            taken_end = start + nbytes
            taken_end_obj: Any = taken_end  # boxed once (see "Compiled build" above)
            rest_obj: Any = rest
            size_at[taken_end_obj] = rest_obj
            self._start_of_end[taken_end + rest] = taken_end_obj
            if rest >= self._floors[cls]:
                bin_[taken_end_obj] = rest_obj  # still this class: same bin, bitmap unchanged
                return start
            rest_cls = (
                self._bin_small[rest]
                if rest <= _SMALL
                else self._bin_big[rest >> 8]
                if rest < _BIG_LIMIT
                else ((e := rest.bit_length() - self._e_bias) << self._sl_bits) + (rest >> e)
            )
            rest_bin = self._bins[rest_cls]
            if not rest_bin:
                self._bitmap |= self._bits[rest_cls]
            rest_bin[taken_end_obj] = rest_obj
        else:
            del self._start_of_end[start + size]
        if not bin_:
            self._bitmap ^= self._bits[cls]
        return start

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merged with its free neighbours."""
        bins = self._bins
        size_at = self._size_at
        start_of_end = self._start_of_end
        self._free += nbytes
        end = offset + nbytes
        size = nbytes
        # Boxed once for the dict operations (see "Compiled build" above).
        offset_obj: Any = offset
        end_obj: Any = end
        # ``in``, then an index and a ``del``: most blocks have no free neighbour, and these are
        # cheaper than ``pop`` (a method call; in the compiled build a generic one).
        if end_obj in size_at:
            after = size_at[end_obj]
            del size_at[end_obj]
            cls = (
                self._bin_small[after]
                if after <= _SMALL
                else self._bin_big[after >> 8]
                if after < _BIG_LIMIT
                else ((e := after.bit_length() - self._e_bias) << self._sl_bits) + (after >> e)
            )
            bin_ = bins[cls]
            del bin_[end_obj]
            if not bin_:
                self._bitmap ^= self._bits[cls]
            end += after
            end_obj = end
            size += after
        if offset_obj in start_of_end:
            before = start_of_end[offset_obj]
            del start_of_end[offset_obj]
            below = offset - before
            size += below
            cls = (
                self._bin_small[below]
                if below <= _SMALL
                else self._bin_big[below >> 8]
                if below < _BIG_LIMIT
                else ((e := below.bit_length() - self._e_bias) << self._sl_bits) + (below >> e)
            )
            bin_ = bins[cls]
            size_at[before] = size
            start_of_end[end_obj] = before
            if size < self._floors[cls + 1]:
                bin_[before] = size  # grown within its class: update in place
                return
            del bin_[before]
            if not bin_:
                self._bitmap ^= self._bits[cls]
            offset_obj = before
        size_obj: Any = size
        size_at[offset_obj] = size_obj
        start_of_end[end_obj] = offset_obj
        cls = (
            self._bin_small[size]
            if size <= _SMALL
            else self._bin_big[size >> 8]
            if size < _BIG_LIMIT
            else ((e := size.bit_length() - self._e_bias) << self._sl_bits) + (size >> e)
        )
        bin_ = bins[cls]
        if not bin_:  # setting a bit that is already set would still build a new bitmap
            self._bitmap |= self._bits[cls]
        bin_[offset_obj] = size_obj

    # --- slow paths ------------------------------------------------------------------------

    def _reserve_misaligned(self, nbytes: int, alignment: int) -> int | None:
        """The extent that came up does not start aligned (by default: as ``_reserve_slow``)."""
        return self._reserve_slow(nbytes, alignment)

    def _reserve_slow(self, nbytes: int, alignment: int) -> int | None:
        """Scan the request's own class (whose extents may or may not be large enough), then
        every larger non-empty one, for an aligned fit; carve it."""
        if nbytes > self._free:
            return None
        mask = alignment - 1
        cls = bin_class(nbytes, self._sl_bits)
        bitmap = self._bitmap >> cls
        while bitmap:
            low = bitmap & -bitmap
            cls += low.bit_length() - 1
            bitmap >>= low.bit_length()
            for start, size in self._bins[cls].items():
                offset = (start + mask) & ~mask
                if offset + nbytes <= start + size:
                    return self._carve(start, size, offset, nbytes)
            cls += 1
        return None

    def _carve(self, start: int, size: int, offset: int, nbytes: int) -> int:
        """Take ``[offset, offset + nbytes)`` out of the free extent ``[start, start + size)``."""
        self._remove(start, size)
        if offset > start:
            self._insert(start, offset - start)
        if offset + nbytes < start + size:
            self._insert(offset + nbytes, start + size - offset - nbytes)
        return offset

    def _insert(self, start: int, size: int) -> None:
        """Add the free extent ``[start, start + size)`` (no merging; counts its bytes)."""
        cls = bin_class(size, self._sl_bits)
        self._bins[cls][start] = size
        self._bitmap |= 1 << cls
        self._size_at[start] = size
        self._start_of_end[start + size] = start
        self._free += size

    def _remove(self, start: int, size: int) -> None:
        """Take the free extent ``[start, start + size)`` out of every index."""
        cls = bin_class(size, self._sl_bits)
        bin_ = self._bins[cls]
        del bin_[start]
        if not bin_:
            self._bitmap ^= 1 << cls
        del self._size_at[start]
        del self._start_of_end[start + size]
        self._free -= size

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none): the top class's largest member."""
        if not self._bitmap:
            return 0
        return max(self._bins[self._bitmap.bit_length() - 1].values())

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return len(self._size_at)

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset."""
        return sorted(self._size_at.items())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, free={self._free}, "
            f"extents={len(self._size_at)}, classes={self._bitmap.bit_count()})"
        )
