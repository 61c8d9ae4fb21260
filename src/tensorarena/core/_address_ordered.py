"""Free extents kept in address order: the shared bookkeeping of first fit and next fit.

The free extents live in two parallel lists, ``starts`` (sorted) and ``sizes``, because the
searches of first and next fit walk sizes in address order and a plain list walk is the fastest
loop Python has. A sentinel extent of size 0 at ``capacity + 1`` ends both lists: no request
fits it and no released block ends at it, so the scans and the neighbour tests need no bounds
checks. Releasing finds its place by bisection and merges with both neighbours; inserting into or
deleting from the lists is a memmove, cheap for the hundreds of extents an arena holds.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["AddressOrderedExtents"]


class AddressOrderedExtents:
    """Splitting and coalescing over ``[0, capacity)``; subclasses supply ``reserve``."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self._free = 0
        self.reset()

    @property
    def capacity(self) -> int:
        """Size of the managed region in bytes."""
        return self._capacity

    def reset(self) -> None:
        """Forget every reservation: the whole region is one free extent again."""
        capacity = self._capacity
        self._starts = [0, capacity + 1]
        self._sizes = [capacity, 0]
        self._free = capacity

    # --- carving and releasing ------------------------------------------------------------

    def _carve(self, i: int, start: int, size: int, offset: int, nbytes: int) -> None:
        """Take ``[offset, offset + nbytes)`` out of free extent ``i`` = ``[start, start + size)``.

        The offset is past ``start`` only when alignment forced a gap, which then stays free.
        """
        starts = self._starts
        sizes = self._sizes
        taken_end = offset + nbytes
        rest = start + size - taken_end
        self._free -= nbytes
        if offset == start:
            if rest:
                starts[i] = taken_end
                sizes[i] = rest
            else:
                del starts[i]
                del sizes[i]
        else:
            sizes[i] = offset - start
            if rest:
                starts.insert(i + 1, taken_end)
                sizes.insert(i + 1, rest)

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merging it with free neighbours."""
        starts = self._starts
        sizes = self._sizes
        self._free += nbytes
        end = offset + nbytes
        # The first free extent above the block; the sentinel guarantees there is one, and
        # starts[-1] (the sentinel) stands in for "no extent below" when i == 0.
        i = bisect_left(starts, offset)
        j = i - 1
        if starts[j] + sizes[j] == offset:
            if starts[i] == end:
                sizes[j] += nbytes + sizes[i]
                del starts[i]
                del sizes[i]
            else:
                sizes[j] += nbytes
        elif starts[i] == end:
            starts[i] = offset
            sizes[i] += nbytes
        else:
            starts.insert(i, offset)
            sizes.insert(i, nbytes)

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none)."""
        return max(self._sizes)

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return len(self._starts) - 1

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset."""
        return list(zip(self._starts[:-1], self._sizes[:-1], strict=True))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, free={self._free}, "
            f"extents={len(self._starts) - 1})"
        )
