"""First fit: the lowest-addressed free extent that can hold the request.

The search walks the free extents from the bottom of the region and takes the first one large
enough: it is linear in the number of free extents by nature, the price of always packing toward
low addresses (which keeps the footprint low). The walk is one tight loop over a list of sizes;
splitting and coalescing are shared with next fit in :mod:`tensorarena.core._address_ordered`.
"""

from __future__ import annotations

from itertools import islice
from typing import ClassVar

from tensorarena.core._address_ordered import AddressOrderedExtents

__all__ = ["FirstFit"]


class FirstFit(AddressOrderedExtents):
    """First-fit placement over ``[0, capacity)`` with splitting and coalescing (linear search)."""

    name: ClassVar[str] = "first_fit"
    coalesces: ClassVar[bool] = True

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` at the lowest offset that fits them aligned; ``None`` if none does."""
        sizes = self._sizes
        # The tightest loop Python has: no index kept. The first extent of at least nbytes is
        # also the first one *equal* to its size, so list.index (in C) recovers its position.
        for size in sizes:
            if size >= nbytes:
                break
        else:
            return None
        i = sizes.index(size)
        start = self._starts[i]
        if start & (alignment - 1):
            return self._reserve_aligned(i, nbytes, alignment)
        # Aligned already (the usual case): shrink the extent from below, inline.
        self._free -= nbytes
        if size > nbytes:
            self._starts[i] = start + nbytes
            sizes[i] = size - nbytes
        else:
            del self._starts[i]
            del sizes[i]
        return start

    def _reserve_aligned(self, first: int, nbytes: int, alignment: int) -> int | None:
        """Slow path: from extent ``first`` on, the lowest one that holds ``nbytes`` aligned."""
        mask = alignment - 1
        starts = self._starts
        for i, size in enumerate(islice(self._sizes, first, None), first):
            if size >= nbytes:
                start = starts[i]
                offset = (start + mask) & ~mask
                if offset + nbytes <= start + size:
                    self._carve(i, start, size, offset, nbytes)
                    return offset
        return None
