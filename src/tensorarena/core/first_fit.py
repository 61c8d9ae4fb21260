"""First fit: the lowest-addressed free extent that can hold the request.

The search walks the free extents from the bottom of the region and takes the first one large
enough: it is linear in the number of free extents by nature, the price of always packing toward
low addresses (which keeps the footprint low). The walk is one tight loop over a list of sizes;
splitting and coalescing are shared with next fit in :mod:`tensorarena.core._address_ordered`.
"""

from __future__ import annotations

from typing import ClassVar

from tensorarena.core._address_ordered import AddressOrderedExtents

__all__ = ["FirstFit"]


class FirstFit(AddressOrderedExtents):
    """First-fit placement over ``[0, capacity)`` with splitting and coalescing (linear search)."""

    name: ClassVar[str] = "first_fit"
    coalesces: ClassVar[bool] = True

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` at the lowest offset that fits them aligned; ``None`` if none does."""
        mask = alignment - 1
        for i, size in enumerate(self._sizes):
            if size >= nbytes:
                start = self._starts[i]
                if not start & mask:
                    # Aligned already (the usual case): shrink the extent from below, inline.
                    rest = size - nbytes
                    self._free -= nbytes
                    if rest:
                        self._starts[i] = start + nbytes
                        self._sizes[i] = rest
                    else:
                        del self._starts[i]
                        del self._sizes[i]
                    return start
                offset = (start + mask) & ~mask
                if offset + nbytes <= start + size:
                    self._carve(i, start, size, offset, nbytes)
                    return offset
        return None
