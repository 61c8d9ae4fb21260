"""Next fit: first fit that resumes where the previous placement ended (a roving pointer).

Starting each search at the end of the last placement spreads blocks across the region instead of
crowding the bottom, so the search rarely rescans the small holes near address 0; the price is a
larger footprint. The search is linear in the number of free extents by nature (it wraps around
once before giving up); like first fit's it runs in C over a byte per extent, and splitting and
coalescing are shared with first fit (:mod:`tensorarena.core._address_ordered`).

The compiled build (see ``setup.py``) walks the sizes themselves instead, natively, from the
rover up and then from the bottom, and keeps no class bytes (see
:mod:`tensorarena.core._address_ordered`).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, ClassVar, Final

from tensorarena.core import _bisect
from tensorarena.core._address_ordered import AT_LEAST, AddressOrderedExtents
from tensorarena.core._arena_errors import size_error
from tensorarena.core._bisect import COMPILED

if TYPE_CHECKING:  # a type only: mypyc compiles it to a C int64_t; no import at run time
    from mypy_extensions import i64

__all__ = ["NextFit"]

# Final: a C static in the compiled build, which bisects with _bisect's compiled loop instead.
_bisect_left: Final = bisect_left


class NextFit(AddressOrderedExtents):
    """Next-fit placement: first fit from a roving pointer, wrapping around (linear search)."""

    name: ClassVar[str] = "next_fit"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes

    def reset(self) -> None:
        """Forget every reservation and move the roving pointer back to offset 0."""
        super().reset()
        self._rover = 0

    @property
    def rover(self) -> int:
        """The offset where the next search starts: the end of the last placement."""
        return self._rover

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` in the first extent at or after the rover that fits; wrap once."""
        if nbytes <= 0:  # called directly, not through an Arena: refuse, change nothing
            raise size_error(nbytes)
        starts = self._starts
        sizes = self._sizes
        rover = self._rover
        first = _bisect.bisect_left(starts, rover) if COMPILED else _bisect_left(starts, rover)
        if first and starts[first - 1] + sizes[first - 1] > rover:
            first -= 1  # the rover lies inside a free extent (a block next to it was freed)
        mask = alignment - 1
        if COMPILED:
            return self._walk(first, nbytes, mask)
        try:
            candidates = self._classes.translate(AT_LEAST[nbytes.bit_length()])
        except IndexError:
            return None  # beyond any power of two a region can have
        # Candidates (extents of at least nbytes' power of two) from the rover up, then from the
        # bottom up to the rover; one of that very power may still be too small.
        i = candidates.find(1, first)
        while i >= 0:
            size = sizes[i]
            if size >= nbytes:
                start = starts[i]
                if not start & mask:
                    # Aligned already (the usual case): shrink the extent from below, inline.
                    self._free -= nbytes
                    self._rover = start + nbytes
                    if size > nbytes:
                        rest = size - nbytes
                        starts[i] = start + nbytes
                        sizes[i] = rest
                        self._classes[i] = rest.bit_length()  # the pure build's search only
                    else:
                        del starts[i]
                        del sizes[i]
                        del self._classes[i]
                    return start
                offset = self._fit(i, size, nbytes, mask)
                if offset is not None:
                    return offset
            i = candidates.find(1, i + 1)
        i = candidates.find(1, 0, first)
        while i >= 0:
            if sizes[i] >= nbytes:
                offset = self._fit(i, sizes[i], nbytes, mask)
                if offset is not None:
                    return offset
            i = candidates.find(1, i + 1, first)
        return None

    def _walk(self, first: int, nbytes: int, mask: int) -> int | None:
        """The compiled build's search: the first extent from ``first`` up, then from the
        bottom up to ``first``, that holds ``nbytes`` at an offset aligned to ``mask + 1``."""
        starts = self._starts
        sizes = self._sizes
        count: i64 = len(sizes) - 1  # the sentinel is last
        at: i64 = first
        while at < count:
            size = sizes[at]
            if size >= nbytes:
                if not starts[at] & mask:
                    # The list's own int object is returned, as in first fit.
                    objects: list[Any] = starts
                    start_obj = objects[at]
                    start: int = start_obj
                    self._carve(at, start, size, start, nbytes)
                    self._rover = start + nbytes
                    return start_obj  # type: ignore[no-any-return]
                offset = self._fit(at, size, nbytes, mask)
                if offset is not None:
                    return offset
            at += 1
        at = 0
        while at < first:
            size = sizes[at]
            if size >= nbytes:
                offset = self._fit(at, size, nbytes, mask)
                if offset is not None:
                    return offset
            at += 1
        return None

    def _fit(self, i: int, size: int, nbytes: int, mask: int) -> int | None:
        """Place ``nbytes`` in extent ``i`` if they fit aligned; move the rover past them."""
        start = self._starts[i]
        offset = (start + mask) & ~mask
        if offset + nbytes > start + size:
            return None
        self._carve(i, start, size, offset, nbytes)
        self._rover = offset + nbytes
        return offset
