"""First fit's free extents in packed native arrays: the compiled build's representation.

:class:`~tensorarena.core.first_fit.FirstFit` keeps its free extents in the address-ordered
Python lists of :mod:`tensorarena.core._address_ordered`. Compiled (see ``setup.py``), it keeps
them here instead, in ``vec[i64]`` from mypyc's runtime library (``librt.vecs``, as
:mod:`tensorarena.core._packed_best_fit` does for best fit): contiguous 64-bit integers, read and
written natively, where a list's items are separate int objects that each bisection and walk
dereferences. Offsets and sizes are below 2^61 (``MAX_SIZE``), so they always fit. The
sentinel, the splitting and the coalescing are ``_address_ordered``'s, step for step, and so is
every placement.

The arrays run *downward* in address: the sentinel first, the lowest extent last. First fit packs
blocks low, so the free extents it splits, merges and creates cluster at low addresses, and an
insertion moves every item after it one place (item by item: librt has no insert). On ``bench
alloc`` a release that creates an extent has a median of 164 free extents above it and 14 below:
stored downward, an insertion moves those few (a deletion is a C loop either way).

The search starts from *floors*: ``floors[c]`` is an offset below which no free extent has a
size of bit length ``c`` or more (a lower bound, so it may lag; non-decreasing in ``c``, as the
exact values are). A search for ``nbytes`` of bit length ``c`` bisects ``starts`` for
``floors[c]`` and walks from there: on ``bench alloc``'s workload ~4 extents instead of ~66 from
the bottom, and a few past thousands of small holes instead of all of them. Carving only shrinks
extents or moves their starts up, which keeps every floor a lower bound; a release lowers the
floors of the classes up to the released extent's (stopping at the first floor already low
enough); a search raises its class's floor to the extent it found first of that class, and the
higher classes' floors to at least that. (The pure build scans class bytes in C instead, see
``_address_ordered``: the upkeep of floors would be interpreted.)

The pure build never imports ``librt``: the names below exist for the type checker and mypyc
alone, and this module's class is only built when the core runs compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # compiled to native operations; nothing is imported at run time
    from librt.vecs import append, vec
    from mypy_extensions import i64

from tensorarena.core._packed_vec import bit_length as _bit_length
from tensorarena.core._packed_vec import count_at_least as _count_at_least
from tensorarena.core._packed_vec import delete as _delete
from tensorarena.core._packed_vec import insert as _insert

__all__ = ["PackedFirstFit"]


class PackedFirstFit:
    """First fit's free extents over ``[0, capacity)`` in packed arrays, with floors; see
    :class:`~tensorarena.core.first_fit.FirstFit` for the rule."""

    def __init__(self, capacity: int) -> None:
        top: i64 = capacity
        # Downward in address, from the sentinel (size 0, past the end) to the lowest extent.
        self._starts = vec[i64]([top + 1, 0])
        self._sizes = vec[i64]([0, top])
        # One floor per bit length an extent (or a request that can fit) may have.
        floors = vec[i64]()
        for _ in range(_bit_length(top) + 1):
            floors = append(floors, 0)
        self._floors = floors
        self._free = capacity

    def extents(self) -> tuple[list[int], list[int]]:
        """``(starts, sizes)`` as Python lists in address order, sentinel (last) included."""
        return list(self._starts)[::-1], list(self._sizes)[::-1]

    def floors(self) -> list[int]:
        """The floors, by bit length (for tests)."""
        return list(self._floors)

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return len(self._starts) - 1

    # --- hot paths -------------------------------------------------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """``FirstFit.reserve`` for a positive ``nbytes``."""
        i = self._walk(nbytes)
        if i < 0:
            return None
        sizes = self._sizes
        starts = self._starts
        size = sizes[i]
        start = starts[i]
        if start & (alignment - 1):
            return self._reserve_aligned(i, nbytes, alignment)
        n: i64 = nbytes
        self._free -= nbytes
        if size > n:  # shrink the extent from below
            starts[i] = start + n
            sizes[i] = size - n
        else:
            self._starts = _delete(starts, i)
            self._sizes = _delete(sizes, i)
        return int(start)

    def _walk(self, nbytes: int) -> i64:
        """The index of the lowest extent of at least ``nbytes``, or -1, walked from the lowest
        extent of ``nbytes``' bit length. The sentinel (size 0, last) never fits."""
        c: i64 = nbytes.bit_length()
        if c >= len(self._floors):
            return -1  # larger than the region
        n: i64 = nbytes
        i = self._first_of_class(c)  # c >= 1: FirstFit refused nbytes <= 0
        sizes = self._sizes
        while i > 0:  # upward in address; the sentinel is item 0
            if sizes[i] >= n:
                return i
            i -= 1
        return -1

    def _first_of_class(self, c: i64) -> i64:
        """The index of the lowest free extent of bit length ``c`` or more (the sentinel's, 0, if
        none), found from ``floors[c]``, whose floor (and those above it) it then raises."""
        floors = self._floors
        starts = self._starts
        sizes = self._sizes
        i = _count_at_least(starts, floors[c]) - 1  # the lowest extent from the floor up
        least: i64 = 1 << (c - 1)
        while i > 0 and sizes[i] < least:
            i -= 1
        start = starts[i]
        top: i64 = len(floors)
        while c < top and floors[c] < start:
            floors[c] = start
            c += 1
        return i

    def _lower_floors(self, start: i64, c: i64) -> None:
        """A free extent of bit length ``c`` now starts at ``start``: no floor of a class up
        to ``c`` may lie above it."""
        floors = self._floors
        while c > 0 and floors[c] > start:
            floors[c] = start
            c -= 1

    def _reserve_aligned(self, first: i64, nbytes: int, alignment: int) -> int | None:
        """Slow path: from extent ``first`` on, the lowest one that holds ``nbytes`` aligned."""
        mask: i64 = alignment - 1
        n: i64 = nbytes
        starts = self._starts
        sizes = self._sizes
        i = first
        while i > 0:  # upward in address, short of the sentinel
            size = sizes[i]
            if size >= n:
                start = starts[i]
                offset = (start + mask) & ~mask
                if offset + n <= start + size:
                    self._carve(i, start, size, offset, n)
                    return int(offset)
            i -= 1
        return None

    def _carve(self, i: i64, start: i64, size: i64, offset: i64, n: i64) -> None:
        """Take ``[offset, offset + n)`` out of free extent ``i`` = ``[start, start + size)``;
        the gap below ``offset`` (alignment) stays free."""
        taken_end = offset + n
        rest = start + size - taken_end
        self._free -= n
        if offset == start:
            if rest:
                self._starts[i] = taken_end
                self._sizes[i] = rest
            else:
                self._starts = _delete(self._starts, i)
                self._sizes = _delete(self._sizes, i)
        else:
            self._sizes[i] = offset - start
            if rest:  # just above the gap in address: before it in the arrays
                self._starts = _insert(self._starts, i, taken_end)
                self._sizes = _insert(self._sizes, i, rest)

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merging it with free neighbours."""
        starts = self._starts
        sizes = self._sizes
        self._free += nbytes
        start: i64 = offset
        end: i64 = start + nbytes
        # Items before p start at or above the block: p - 1 is the first free extent above it
        # (the sentinel at worst), p the one below it; the sentinel stands in for "no extent
        # below" when there is none.
        p = _count_at_least(starts, start)
        i = p - 1
        j: i64 = 0  # not a conditional expression: mypyc would box it
        if p < len(starts):
            j = p
        if starts[j] + sizes[j] == start:
            size = sizes[j] + nbytes
            if starts[i] == end:
                size += sizes[i]
                self._starts = _delete(starts, i)
                sizes = _delete(sizes, i)
                self._sizes = sizes
                j = i  # the extent below moved down one place
            sizes[j] = size
            self._lower_floors(self._starts[j], _bit_length(size))
        elif starts[i] == end:
            starts[i] = start
            size = sizes[i] + nbytes
            sizes[i] = size
            self._lower_floors(start, _bit_length(size))
        else:
            self._starts = _insert(starts, p, start)
            self._sizes = _insert(sizes, p, nbytes)
            self._lower_floors(start, _bit_length(nbytes))
