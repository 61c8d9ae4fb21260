"""Free extents kept in address order: the shared bookkeeping of first fit and next fit.

The free extents live in two parallel lists, ``starts`` (sorted) and ``sizes``, because the
searches of first and next fit walk sizes in address order and a plain list walk is the fastest
loop Python has. A sentinel extent of size 0 at ``capacity + 1`` ends both lists: no request
fits it and no released block ends at it, so the scans and the neighbour tests need no bounds
checks. Releasing finds its place by bisection and merges with both neighbours; inserting into or
deleting from the lists is a memmove, cheap for the hundreds of extents an arena holds.

A third parallel sequence, ``classes`` (a ``bytearray``), holds each extent's power of two
(``size.bit_length()``, 0 for the sentinel), so the searches of the pure build run in C rather
than in an interpreted loop: ``classes.translate(AT_LEAST[c])`` turns it into 1 for every extent
of at least ``2**(c-1)`` bytes and 0 elsewhere, and ``find(1, pos)`` returns the next candidate
in address order. Every extent of a higher power of two than the request fits; one of the same
power may not, and is checked and skipped. A search costs a fixed C call plus a little per
skipped candidate, where walking the extents in Python cost several times more; keeping the
classes costs one ``bit_length`` and one byte store per change.

The compiled build (see ``setup.py``) keeps no class bytes (``classes`` stays empty): its
searches walk the sizes themselves, natively, and every byte store, insertion and deletion
on a ``bytearray`` goes through Python's generic item protocol there, which cost a noticeable
share of a first fit pair (``bench alloc``, ``bench/RESULTS.md``). The price is a slower search
over thousands of free extents (a few times the byte scan's cost an extent), a fragmentation the
benchmarked arenas never reach (a few hundred extents). Each update of the classes is written
``if not COMPILED``.

First fit, compiled, keeps its extents in packed arrays instead, searched from *floors*
(:mod:`tensorarena.core._packed_first_fit`): this class then holds empty lists and hands
``release`` and the queries to that representation.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

from tensorarena.core import _bisect
from tensorarena.core._bisect import COMPILED
from tensorarena.core._builtin import BuiltinStrategy
from tensorarena.core._packed_first_fit import PackedFirstFit

__all__ = ["AT_LEAST", "AddressOrderedExtents"]

#: ``AT_LEAST[c]`` maps a class byte to 1 when it is at least ``c``, else to 0 (for ``translate``).
AT_LEAST: Final = [bytes(c) + b"\x01" * (256 - c) for c in range(256)]
# Final: the compiled build (see setup.py) keeps it in a C static, not looked up by name per call;
# it bisects with _bisect's compiled loop instead, the pure build with the bisect module.
_bisect_left: Final = bisect_left


class AddressOrderedExtents(BuiltinStrategy):
    """Splitting and coalescing over ``[0, capacity)``; subclasses supply ``reserve``."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._starts: list[int] = []
        self._sizes: list[int] = []
        self._classes = bytearray()
        self._free = 0
        # First fit's packed extents (compiled), which then stand for the lists above.
        self._packed: PackedFirstFit | None = None
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
        self._classes = bytearray() if COMPILED else bytearray((capacity.bit_length(), 0))
        self._free = capacity

    # --- carving and releasing ------------------------------------------------------------

    def _carve(self, i: int, start: int, size: int, offset: int, nbytes: int) -> None:
        """Take ``[offset, offset + nbytes)`` out of free extent ``i`` = ``[start, start + size)``.

        The offset is past ``start`` only when alignment forced a gap, which then stays free.
        """
        starts = self._starts
        sizes = self._sizes
        classes = self._classes
        taken_end = offset + nbytes
        rest = start + size - taken_end
        self._free -= nbytes
        if offset == start:
            if rest:
                starts[i] = taken_end
                sizes[i] = rest
                if not COMPILED:
                    classes[i] = rest.bit_length()
            else:
                del starts[i]
                del sizes[i]
                if not COMPILED:
                    del classes[i]
        else:
            sizes[i] = offset - start
            if not COMPILED:
                classes[i] = (offset - start).bit_length()
            if rest:
                starts.insert(i + 1, taken_end)
                sizes.insert(i + 1, rest)
                if not COMPILED:
                    classes.insert(i + 1, rest.bit_length())

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merging it with free neighbours."""
        packed = self._packed
        if packed is not None:
            packed.release(offset, nbytes)
            return
        starts = self._starts
        sizes = self._sizes
        self._free += nbytes
        end = offset + nbytes
        # The first free extent above the block; the sentinel guarantees there is one, and
        # starts[-1] (the sentinel) stands in for "no extent below" when i == 0.
        classes = self._classes
        i = _bisect.bisect_left(starts, offset) if COMPILED else _bisect_left(starts, offset)
        j = i - 1
        if starts[j] + sizes[j] == offset:
            if starts[i] == end:
                size = sizes[j] + nbytes + sizes[i]
                del starts[i]
                del sizes[i]
                if not COMPILED:
                    del classes[i]
            else:
                size = sizes[j] + nbytes
            sizes[j] = size
            if not COMPILED:
                classes[j] = size.bit_length()
        elif starts[i] == end:
            starts[i] = offset
            size = sizes[i] + nbytes
            sizes[i] = size
            if not COMPILED:
                classes[i] = size.bit_length()
        else:
            starts.insert(i, offset)
            sizes.insert(i, nbytes)
            if not COMPILED:
                classes.insert(i, nbytes.bit_length())

    # --- queries ---------------------------------------------------------------------------

    def _extents(self) -> tuple[list[int], list[int]]:
        """``(starts, sizes)``, sentinel included: the lists, or a copy of the packed ones."""
        packed = self._packed
        return (self._starts, self._sizes) if packed is None else packed.extents()

    def free_bytes(self) -> int:
        """Total free bytes."""
        packed = self._packed
        return self._free if packed is None else packed.free_bytes()

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none)."""
        return max(self._extents()[1])

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        packed = self._packed
        return len(self._starts) - 1 if packed is None else packed.free_extent_count()

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset."""
        starts, sizes = self._extents()
        return list(zip(starts[:-1], sizes[:-1], strict=True))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, free={self.free_bytes()}, "
            f"extents={self.free_extent_count()})"
        )
