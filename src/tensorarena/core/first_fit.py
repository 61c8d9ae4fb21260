"""First fit: the lowest-addressed free extent that can hold the request.

The search walks the free extents from the bottom of the region and takes the first one large
enough: it is linear in the number of free extents by nature, the price of always packing toward
low addresses (which keeps the footprint low). The walk runs in C, over a byte per extent that
holds its power of two (see :mod:`tensorarena.core._address_ordered`, which also does the
splitting and coalescing shared with next fit).

The compiled build (see ``setup.py``) keeps the extents in packed 64-bit arrays instead and walks
the sizes themselves, natively, from the floor of the request's size class (see
:mod:`tensorarena.core._packed_first_fit`): ~4 extents walked on ``bench alloc``'s workload
instead of ~66 from the bottom, and past ten thousand small holes a search stays well under a
microsecond where walking them all cost tens of microseconds (``bench/RESULTS.md``).
"""

from __future__ import annotations

from itertools import islice
from typing import ClassVar

from tensorarena.core._address_ordered import AT_LEAST, AddressOrderedExtents
from tensorarena.core._arena_errors import size_error
from tensorarena.core._bisect import COMPILED
from tensorarena.core._packed_first_fit import PackedFirstFit

__all__ = ["FirstFit"]


class FirstFit(AddressOrderedExtents):
    """First-fit placement over ``[0, capacity)`` with splitting and coalescing (linear search)."""

    name: ClassVar[str] = "first_fit"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes

    def reset(self) -> None:
        """Forget every reservation: the whole region is one free extent again."""
        super().reset()
        if COMPILED:  # the packed extents stand for the (emptied) lists
            self._packed = PackedFirstFit(self._capacity)
            self._starts, self._sizes = [], []

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` at the lowest offset that fits them aligned; ``None`` if none does."""
        if nbytes <= 0:  # called directly, not through an Arena: refuse, change nothing
            raise size_error(nbytes)
        packed = self._packed
        if packed is not None:
            return packed.reserve(nbytes, alignment)
        sizes = self._sizes
        try:
            candidates = self._classes.translate(AT_LEAST[nbytes.bit_length()])
        except IndexError:
            return None  # beyond any power of two a region can have
        # The lowest extent of at least nbytes' power of two; one of that very power may still
        # be too small, so skip those.
        i = candidates.find(1)
        while i >= 0 and sizes[i] < nbytes:
            i = candidates.find(1, i + 1)
        if i < 0:
            return None
        size = sizes[i]
        starts = self._starts
        start = starts[i]
        if start & (alignment - 1):
            return self._reserve_aligned(i, nbytes, alignment)
        # Aligned already (the usual case): shrink the extent from below, inline.
        self._free -= nbytes
        if size > nbytes:
            rest = size - nbytes
            starts[i] = start + nbytes
            sizes[i] = rest
            self._classes[i] = rest.bit_length()
        else:
            del starts[i]
            del sizes[i]
            del self._classes[i]
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
