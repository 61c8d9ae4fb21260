"""Best fit: the smallest free extent that can hold the request (lowest address on ties).

Free extents are indexed twice. By size: one sorted list of integer keys
``size << shift | offset`` (``shift`` = bits of the capacity), so a single bisection finds the
smallest extent of at least ``nbytes`` and ties go to the lowest offset; ints compare faster than
tuples and cost no allocation. By boundary: a dict from each free extent's start to its size and
one from its end to its start, so a released block finds both neighbours in O(1). A reservation is
one bisection plus one list deletion and at most two insertions (memmoves); a release is at most
two deletions and one insertion.

Alignment: the keys are scanned upward from the first large-enough extent until one holds the
request at an aligned offset, so the result is the smallest extent that fits *aligned*. Requests
whose size is a multiple of every alignment in play (the usual case) stop at the first key.

The hot paths name a few ints twice, ``end`` and ``end_obj: Any``: in the compiled build (see
``setup.py``) an ``int`` local is an unboxed C integer, boxed anew (an allocation) at each dict
operation it takes part in; the ``Any`` twin is boxed once and reused (~5 % of a pair, measured).
Interpreted, both names hold the same object.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any, ClassVar, Final

from tensorarena.core import _bisect
from tensorarena.core._bisect import COMPILED
from tensorarena.core._builtin import BuiltinStrategy

__all__ = ["BestFit"]

# Final names: the compiled build (see setup.py) keeps them in C statics instead of looking them
# up in the module's namespace at every call. It searches with _bisect's loops, compiled with this
# module and called directly (~10 % of a pair less); the pure build with the bisect module.
_bisect_left: Final = bisect_left
_insort: Final = insort


class BestFit(BuiltinStrategy):
    """Best-fit placement over ``[0, capacity)`` with splitting and coalescing, O(log n) search."""

    name: ClassVar[str] = "best_fit"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._shift = capacity.bit_length()
        self._offset_mask = (1 << self._shift) - 1
        self._keys: list[int] = []
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
        capacity = self._capacity
        self._keys = [capacity << self._shift]
        self._size_at = {0: capacity}
        self._start_of_end = {capacity: 0}
        self._free = capacity

    # --- hot paths -------------------------------------------------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` from the smallest free extent that holds them aligned."""
        keys = self._keys
        shift = self._shift
        wanted = nbytes << shift
        i = _bisect.bisect_left(keys, wanted) if COMPILED else _bisect_left(keys, wanted)
        if i == len(keys):
            return None
        key = keys[i]
        start = key & self._offset_mask
        mask = alignment - 1
        if start & mask:
            return self._reserve_aligned(i, nbytes, mask)
        # Common case: the extent is aligned, take its bottom and give the rest back.
        size = key >> shift
        del keys[i]
        size_at = self._size_at
        del size_at[start]
        self._free -= nbytes
        rest = size - nbytes
        if rest:
            taken_end = start + nbytes
            taken_end_obj: Any = taken_end
            size_at[taken_end_obj] = rest
            self._start_of_end[taken_end + rest] = taken_end_obj
            key = (rest << shift) | taken_end
            _bisect.insort(keys, key) if COMPILED else _insort(keys, key)
        else:
            del self._start_of_end[start + size]
        return start

    def _reserve_aligned(self, i: int, nbytes: int, mask: int) -> int | None:
        """Slow path: walk extents by size until one holds ``nbytes`` at an aligned offset."""
        keys = self._keys
        shift = self._shift
        offset_mask = self._offset_mask
        for i in range(i, len(keys)):  # noqa: B020 - the scan resumes from the given key
            key = keys[i]
            start = key & offset_mask
            size = key >> shift
            offset = (start + mask) & ~mask
            if offset + nbytes <= start + size:
                break
        else:
            return None
        size_at = self._size_at
        start_of_end = self._start_of_end
        end = start + size
        taken_end = offset + nbytes
        del keys[i]
        self._free -= nbytes
        if offset > start:  # the alignment gap stays free
            size_at[start] = offset - start
            start_of_end[offset] = start
            key = ((offset - start) << shift) | start
            _bisect.insort(keys, key) if COMPILED else _insort(keys, key)
        else:
            del size_at[start]
        if taken_end < end:
            size_at[taken_end] = end - taken_end
            start_of_end[end] = taken_end
            key = ((end - taken_end) << shift) | taken_end
            _bisect.insort(keys, key) if COMPILED else _insort(keys, key)
        else:
            del start_of_end[end]
        return offset

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merging it with free neighbours."""
        keys = self._keys
        shift = self._shift
        size_at = self._size_at
        start_of_end = self._start_of_end
        self._free += nbytes
        end = offset + nbytes
        size = nbytes
        offset_obj: Any = offset  # boxed once (see the module docstring)
        end_obj: Any = end
        # ``in``, then an index and a ``del``: most blocks have no free neighbour, and these are
        # cheaper than ``pop`` (a method call; in the compiled build a generic one).
        if offset_obj in start_of_end:
            before = start_of_end[offset_obj]
            del start_of_end[offset_obj]
            below = offset - before
            key = (below << shift) | before
            del keys[_bisect.bisect_left(keys, key) if COMPILED else _bisect_left(keys, key)]
            size += below
            offset = offset_obj = before
        if end_obj in size_at:
            after = size_at[end_obj]
            del size_at[end_obj]
            key = (after << shift) | end
            del keys[_bisect.bisect_left(keys, key) if COMPILED else _bisect_left(keys, key)]
            end += after  # its end → start entry is overwritten below
            end_obj = end
            size += after
        size_at[offset_obj] = size
        start_of_end[end_obj] = offset_obj
        key = (size << shift) | offset
        _bisect.insort(keys, key) if COMPILED else _insort(keys, key)

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none)."""
        return self._keys[-1] >> self._shift if self._keys else 0

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return len(self._keys)

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset."""
        return sorted(self._size_at.items())

    def __repr__(self) -> str:
        return (
            f"BestFit(capacity={self._capacity}, free={self._free}, "
            f"extents={len(self._keys)})"
        )
