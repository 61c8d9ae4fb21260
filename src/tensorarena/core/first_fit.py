"""First fit: the lowest-addressed free extent that can hold the request.

The search walks the free extents from the bottom of the region and takes the first one large
enough: it is linear in the number of free extents by nature, the price of always packing toward
low addresses (which keeps the footprint low). The walk runs in C, over a byte per extent that
holds its power of two (see :mod:`tensorarena.core._address_ordered`, which also does the
splitting and coalescing shared with next fit).

The compiled build (see ``setup.py``) walks the sizes themselves instead, natively, and keeps no
class bytes; it starts the walk at the floor of the request's size class (see
:mod:`tensorarena.core._address_ordered`): ~4 extents walked on ``bench alloc``'s workload
instead of ~66 from the bottom, and past 10 000 small holes 0.6 µs a search where walking them
all cost 11-22 µs.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any, ClassVar

from tensorarena.core._address_ordered import AT_LEAST, AddressOrderedExtents
from tensorarena.core._arena_errors import size_error
from tensorarena.core._bisect import COMPILED

if TYPE_CHECKING:  # a type only: mypyc compiles it to a C int64_t; no import at run time
    from mypy_extensions import i64

__all__ = ["FirstFit"]


class FirstFit(AddressOrderedExtents):
    """First-fit placement over ``[0, capacity)`` with splitting and coalescing (linear search)."""

    name: ClassVar[str] = "first_fit"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, floors=True)

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` at the lowest offset that fits them aligned; ``None`` if none does."""
        if nbytes <= 0:  # called directly, not through an Arena: refuse, change nothing
            raise size_error(nbytes)
        sizes = self._sizes
        if COMPILED:
            i = self._walk(nbytes)
        else:
            try:
                candidates = self._classes.translate(AT_LEAST[nbytes.bit_length()])
            except IndexError:
                return None  # beyond any power of two a region can have
            # The lowest extent of at least nbytes' power of two; one of that very power may
            # still be too small, so skip those.
            i = candidates.find(1)
            while i >= 0 and sizes[i] < nbytes:
                i = candidates.find(1, i + 1)
        if i < 0:
            return None
        size = sizes[i]
        # The list's own int object is returned: compiled, an ``int`` local would be boxed
        # anew (an allocation) on the way out; interpreted, both names hold the same object.
        starts: list[Any] = self._starts
        start_obj = starts[i]
        start: int = start_obj
        if start & (alignment - 1):
            return self._reserve_aligned(i, nbytes, alignment)
        # Aligned already (the usual case): shrink the extent from below, inline.
        self._free -= nbytes
        if size > nbytes:
            rest = size - nbytes
            starts[i] = start + nbytes
            sizes[i] = rest
            if not COMPILED:
                self._classes[i] = rest.bit_length()
        else:
            del starts[i]
            del sizes[i]
            if not COMPILED:
                del self._classes[i]
        return start_obj  # type: ignore[no-any-return]

    def _walk(self, nbytes: int) -> int:
        """The compiled build's search: the index of the lowest extent of at least ``nbytes``,
        or -1, walked from the lowest extent of ``nbytes``' bit length (see the floors of
        :mod:`tensorarena.core._address_ordered`). The sentinel (size 0, last) never fits."""
        c: i64 = nbytes.bit_length()
        if c >= len(self._floors):
            return -1  # larger than the region
        i = self._first_of_class(c if c else 1)
        sizes = self._sizes
        last: i64 = len(sizes) - 1
        while i < last:
            if sizes[i] >= nbytes:
                return i
            i += 1
        return -1

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
