"""First fit: the lowest-addressed free extent that can hold the request.

Free extents are kept sorted by offset (a list, searched by bisect on release) with two dicts that
map each free extent's start to its size and its end to its start, so that a released extent
merges with both neighbours in O(1) dict operations plus one list insertion or deletion. A
reservation scans the sorted list from the bottom: the search is linear in the number of free
extents by nature, which is the price of always packing toward low addresses.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import ClassVar

__all__ = ["FirstFit"]


class FirstFit:
    """First-fit placement over ``[0, capacity)`` with splitting and coalescing."""

    name: ClassVar[str] = "first_fit"
    coalesces: ClassVar[bool] = True

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self.reset()

    @property
    def capacity(self) -> int:
        return self._capacity

    def reset(self) -> None:
        self._starts: list[int] = [0]  # sorted offsets of free extents
        self._size_at: dict[int, int] = {0: self._capacity}
        self._start_of_end: dict[int, int] = {self._capacity: 0}
        self._free = self._capacity

    # --- hot paths -------------------------------------------------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        size_at = self._size_at
        mask = alignment - 1
        for i, start in enumerate(self._starts):
            size = size_at[start]
            if size < nbytes:
                continue
            offset = (start + mask) & ~mask
            if offset + nbytes > start + size:
                continue
            self._carve(i, start, size, offset, nbytes)
            return offset
        return None

    def _carve(self, i: int, start: int, size: int, offset: int, nbytes: int) -> None:
        """Take ``[offset, offset + nbytes)`` out of the free extent ``i`` = ``[start, start+size)``."""
        size_at = self._size_at
        start_of_end = self._start_of_end
        end = start + size
        taken_end = offset + nbytes
        self._free -= nbytes
        if offset == start:
            # Leading part taken: the extent shrinks from below (or vanishes).
            del size_at[start]
            if taken_end == end:
                del start_of_end[end]
                del self._starts[i]
            else:
                size_at[taken_end] = end - taken_end
                start_of_end[end] = taken_end
                self._starts[i] = taken_end
        else:
            # An alignment gap stays free below the block.
            size_at[start] = offset - start
            start_of_end[offset] = start
            if taken_end == end:
                del start_of_end[end]
            else:
                size_at[taken_end] = end - taken_end
                start_of_end[end] = taken_end
                self._starts.insert(i + 1, taken_end)

    def release(self, offset: int, nbytes: int) -> None:
        size_at = self._size_at
        start_of_end = self._start_of_end
        starts = self._starts
        self._free += nbytes
        end = offset + nbytes
        before = start_of_end.pop(offset, None)  # a free extent ending where this one starts
        after = size_at.pop(end, None)  # a free extent starting where this one ends
        if before is not None:
            if after is not None:
                # Bridge: [before, offset) + block + [end, end + after) become one extent.
                del start_of_end[end + after]
                del starts[bisect_left(starts, end)]
                size_at[before] = end + after - before
                start_of_end[end + after] = before
            else:
                size_at[before] = end - before
                start_of_end[end] = before
        elif after is not None:
            del start_of_end[end + after]
            starts[bisect_left(starts, end)] = offset
            size_at[offset] = nbytes + after
            start_of_end[end + after] = offset
        else:
            starts.insert(bisect_left(starts, offset), offset)
            size_at[offset] = nbytes
            start_of_end[end] = offset

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        return self._free

    def largest_free(self) -> int:
        return max(self._size_at.values(), default=0)

    def free_extent_count(self) -> int:
        return len(self._starts)

    def free_extents(self) -> list[tuple[int, int]]:
        return [(start, self._size_at[start]) for start in self._starts]

    def __repr__(self) -> str:
        return (
            f"FirstFit(capacity={self._capacity}, free={self._free}, "
            f"extents={len(self._starts)})"
        )
