"""Segregated fit: free extents binned by size class, four classes per power of two.

The classes follow jemalloc and RMM's arena: sizes below 8 have a class each, and every power of
two above is cut into four equal steps (8, 10, 12, 14, 16, 20, 24, 28, 32, ...), so the extents
of one class differ in size by less than 25 %. Each class holds its free extents in a dict
(offset → size, popped last-in first-out, which keeps recently freed memory warm), and one
integer bitmap marks the non-empty classes.

A reservation rounds the request *up* to a class boundary: every extent in that class or above is
large enough, so the lowest set bit of ``bitmap >> class`` (``(m & -m).bit_length()``) names the
class to pop from in O(1), falling back to larger classes automatically. Only when nothing there
fits (or alignment gets in the way) does a slow path scan the request's own class, whose extents
may or may not be large enough, and then the larger ones.

This is a segregated *free list*, not a slab: the extent taken is split, the remainder goes back to
its own class, and a released block coalesces with its free neighbours (found through two boundary
dicts, start → size and end → start) before it is binned, so freeing everything restores one
extent. The class arithmetic is written out inline in the hot paths because a helper call would
cost more than the arithmetic itself, and the common cases skip work: a remainder that stays in
its extent's class goes back into the same bin, and a released block that grows the free extent
below it within that extent's class updates it in place.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["SegregatedFit", "class_floor", "size_class"]


def size_class(nbytes: int) -> int:
    """The class of a free extent of ``nbytes``: the class whose range contains it."""
    e = (nbytes | 7).bit_length() - 3
    return (e << 2) + (nbytes >> e)


def class_floor(cls: int) -> int:
    """The smallest size in class ``cls``."""
    if cls < 8:
        return cls
    return (4 | (cls & 3)) << ((cls >> 2) - 1)


class SegregatedFit:
    """Size-class free lists over ``[0, capacity)``, O(1) search, splitting and coalescing."""

    name: ClassVar[str] = "segregated_fit"
    coalesces: ClassVar[bool] = True

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        # One class past the capacity's own, so a rounded-up request that can fit has a bin; a
        # larger one falls off the end of the list and is refused by the IndexError handler.
        classes = size_class(capacity) + 2
        self._bins: list[dict[int, int]] = [{} for _ in range(classes)]
        self._floors = [class_floor(cls) for cls in range(classes + 1)]
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
    # The class of n is (e << 2) + (n >> e) with e = (n | 7).bit_length() - 3: n >> e is the top
    # three bits (4..7), the power of two adds 4 per step, and ``| 7`` makes sizes below 8 their
    # own classes without a branch. Rounding n up to its class floor is the same with
    # ``(n + (1 << e) - 1) >> e``.

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` from the lowest non-empty class that surely holds them."""
        e = (nbytes | 7).bit_length() - 3
        cls = (e << 2) + ((nbytes + (1 << e) - 1) >> e)
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
            return self._reserve_slow(nbytes, alignment)
        size_at = self._size_at
        del size_at[start]
        self._free -= nbytes
        rest = size - nbytes
        if rest:
            taken_end = start + nbytes
            size_at[taken_end] = rest
            self._start_of_end[taken_end + rest] = taken_end
            if rest >= self._floors[cls]:
                bin_[taken_end] = rest  # still this class: same bin, bitmap unchanged
                return start
            e = (rest | 7).bit_length() - 3
            rest_cls = (e << 2) + (rest >> e)
            self._bins[rest_cls][taken_end] = rest
            self._bitmap |= 1 << rest_cls
        else:
            del self._start_of_end[start + size]
        if not bin_:
            self._bitmap ^= 1 << cls
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
            e = (after | 7).bit_length() - 3
            cls = (e << 2) + (after >> e)
            bin_ = bins[cls]
            del bin_[end]
            if not bin_:
                self._bitmap ^= 1 << cls
            end += after
        before = start_of_end.pop(offset, None)
        if before is None:
            size = end - offset
        else:
            size = end - before
            below = offset - before
            e = (below | 7).bit_length() - 3
            cls = (e << 2) + (below >> e)
            bin_ = bins[cls]
            size_at[before] = size
            start_of_end[end] = before
            if size < self._floors[cls + 1]:
                bin_[before] = size  # grown within its class: update in place
                return
            del bin_[before]
            if not bin_:
                self._bitmap ^= 1 << cls
            offset = before
        size_at[offset] = size
        start_of_end[end] = offset
        e = (size | 7).bit_length() - 3
        cls = (e << 2) + (size >> e)
        bins[cls][offset] = size
        self._bitmap |= 1 << cls

    # --- slow paths ------------------------------------------------------------------------

    def _reserve_slow(self, nbytes: int, alignment: int) -> int | None:
        """Scan the request's own class, then every larger one, for an aligned fit."""
        if nbytes > self._free:
            return None
        mask = alignment - 1
        cls = size_class(nbytes)
        bitmap = self._bitmap >> cls
        while bitmap:
            low = bitmap & -bitmap
            cls += low.bit_length() - 1
            bitmap >>= low.bit_length()
            for start, size in self._bins[cls].items():
                offset = (start + mask) & ~mask
                if offset + nbytes <= start + size:
                    self._remove(start, size)
                    if offset > start:
                        self._insert(start, offset - start)
                    if offset + nbytes < start + size:
                        self._insert(offset + nbytes, start + size - offset - nbytes)
                    return offset
            cls += 1
        return None

    def _insert(self, start: int, size: int) -> None:
        """Add the free extent ``[start, start + size)`` (no merging; counts its bytes)."""
        cls = size_class(size)
        self._bins[cls][start] = size
        self._bitmap |= 1 << cls
        self._size_at[start] = size
        self._start_of_end[start + size] = start
        self._free += size

    def _remove(self, start: int, size: int) -> None:
        """Take the free extent ``[start, start + size)`` out of every index."""
        cls = size_class(size)
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
            f"SegregatedFit(capacity={self._capacity}, free={self._free}, "
            f"extents={len(self._size_at)}, classes={self._bitmap.bit_count()})"
        )
