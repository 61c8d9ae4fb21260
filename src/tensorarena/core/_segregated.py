"""Segregated free lists: the engine shared by segregated fit and TLSF.

Free extents are binned by size class. A power of two is cut into ``2**sl_bits`` equal steps
(segregated fit: 4, TLSF: 16), sizes below ``2 << sl_bits`` have a class each, and the class
index is flat: ``(e << sl_bits) + (n >> e)`` with ``e = (n | (2 << sl_bits) - 1).bit_length() -
sl_bits - 1``. Row ``cls >> sl_bits`` of the classes is TLSF's first level, ``cls & (2**sl_bits
- 1)`` its second.

The layout is the C original's, written for the compiler (see ``setup.py``):

* Every extent of the region, free or held, is a :class:`SegregatedBlock` (start, size, class)
  chained to its physical neighbours: the boundary tags. Releasing a block finds its neighbours
  through the chain, so the only map is ``held`` (start → block of the live ones), one insertion
  per reserve and one removal per release. The dicts of free extents by start and by end that the
  engine used before cost 4–8 dict operations on boxed ints a pair (``_Py_dict_lookup`` was a
  large share of a compiled pair).
* A free block is also on its class's doubly linked free list (intrusive: ``prev_free`` /
  ``next_free``), pushed and popped at the head, so the extents of one class come last-in
  first-out, which keeps recently freed memory warm.
* The bitmaps are two levels of machine words, as in TLSF: one first-level word marks the
  non-empty rows (at most 60 up to ``MAX_SIZE``, 62 below 2**62 bytes), and each row's own word
  (``_Row.bits``, at most 16 bits) marks its non-empty classes. Compiled, every one of them
  stays an unboxed C integer (a short int: below 2**62); one Python int over all the classes
  (the old layout, ~600 bits for TLSF) allocated a new long at each update.
* Blocks and rows are native classes: an attribute is a field of a C struct, and a block link is
  a pointer. Blocks taken out of the chain by a merge wait in a spare list for the next split,
  so the steady state allocates no objects.

``reserve`` rounds the request *up* to a class boundary: every extent in that class or above is
large enough, so the first non-empty class from there (the row's word, else the first-level word)
names the list to pop from, in O(1). A remainder that stays in the extent's class keeps the
extent's place in its list (the taken part gets a new block below it); otherwise it is binned
anew. What the engine cannot serve in O(1) (nothing large enough in the classes that surely fit,
or an extent that is not aligned) goes to a slow path that scans the request's own class and the
larger ones; TLSF first retries a misaligned request padded, in O(1).

Class indices are computed (``bit_length``, two shifts and an add), not looked up: compiled,
that is a few machine instructions, where the tables of class by size that the engine used before
cost a bounds-checked list read and a pointer chase each (``CPyList_GetItem`` was a visible share of
a compiled pair). Interpreted, the hot paths write the arithmetic out rather than call
a helper.

``free_extents`` (for checks, never on a hot path) walks the whole structure and raises
:class:`~tensorarena.errors.InvariantError` when the chain, the lists, the bitmaps and the counters
disagree, so an arena's expensive debug checks find a corrupted engine.
"""

from __future__ import annotations

from typing import Any, Final

from tensorarena.core._builtin import BuiltinStrategy
from tensorarena.core._segregated_check import check_structure
from tensorarena.errors import (
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    SizeMismatchError,
)

__all__ = ["SegregatedBlock", "SegregatedExtents", "bin_class", "floor_of_class", "search_class"]

# Final: the compiled build (see setup.py) inlines it instead of looking it up by name.
#: The class of a block that is held, not free.
_HELD: Final = -1


def bin_class(nbytes: int, sl_bits: int) -> int:
    """The class whose range contains a free extent of ``nbytes``."""
    e = (nbytes | ((2 << sl_bits) - 1)).bit_length() - sl_bits - 1
    return (e << sl_bits) + (nbytes >> e)


def search_class(nbytes: int, sl_bits: int) -> int:
    """The lowest class all of whose extents hold ``nbytes``: ``nbytes`` rounded up to a floor."""
    e = (nbytes | ((2 << sl_bits) - 1)).bit_length() - sl_bits - 1
    return (e << sl_bits) + ((nbytes + (1 << e) - 1) >> e)


def floor_of_class(cls: int, sl_bits: int) -> int:
    """The smallest size in class ``cls``."""
    if cls < 2 << sl_bits:
        return cls
    step = 1 << sl_bits
    return (step | (cls & (step - 1))) << ((cls >> sl_bits) - 1)


def _lowest_bit(word: int) -> int:
    """Index of the lowest set bit of ``word`` (which is not 0)."""
    return (word & -word).bit_length() - 1


class SegregatedBlock:
    """One extent ``[start, start + size)`` of the region: held (``cls == _HELD``) or free in
    class ``cls``. Physical neighbours and free-list neighbours are linked both ways."""

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size
        self.cls = _HELD
        self.prev_phys: SegregatedBlock | None = None
        self.next_phys: SegregatedBlock | None = None
        self.prev_free: SegregatedBlock | None = None
        self.next_free: SegregatedBlock | None = None


class _Row:
    """One power of two's classes: a word with a bit per non-empty class (TLSF's second level)."""

    def __init__(self) -> None:
        self.bits = 0


class SegregatedExtents(BuiltinStrategy):
    """Size-class free lists over ``[0, capacity)``; subclasses choose ``_SL_BITS``."""

    #: log2 of the number of classes per power of two.
    _SL_BITS: int = 2

    def __init__(self, capacity: int) -> None:
        sl_bits = self._SL_BITS
        self._sl_bits = sl_bits
        self._sl_mask = (1 << sl_bits) - 1
        self._e_bias = sl_bits + 1
        self._small_mask = (2 << sl_bits) - 1
        self._capacity = capacity
        # One class past the capacity's own, so a rounded-up request that can fit has a list; a
        # larger one is refused by the bound test.
        self._classes = bin_class(capacity, sl_bits) + 2
        self._heads: list[SegregatedBlock | None] = [None] * self._classes
        self._rows = [_Row() for _ in range((self._classes >> sl_bits) + 1)]
        self._fl_bits = 0
        self._held: dict[int, SegregatedBlock] = {}
        self._spare: list[SegregatedBlock] = []
        self._first: SegregatedBlock | None = None
        self._free = 0
        self._extents = 0
        self.reset()

    @property
    def capacity(self) -> int:
        """Size of the managed region in bytes."""
        return self._capacity

    def reset(self) -> None:
        """Forget every reservation: the whole region is one free extent again."""
        self._heads = [None] * self._classes
        for row in self._rows:
            row.bits = 0
        self._fl_bits = 0
        self._held = {}
        self._free = self._extents = 0
        self._first = None
        if self._capacity > 0:
            block = SegregatedBlock(0, self._capacity)
            self._first = block
            self._link(block, bin_class(self._capacity, self._sl_bits))
            self._free = self._capacity

    # --- free lists and bitmaps --------------------------------------------------------------

    def _link(self, block: SegregatedBlock, cls: int) -> None:
        """Push the free ``block`` on the head of class ``cls``'s list."""
        head = self._heads[cls]
        block.cls = cls
        block.prev_free = None
        block.next_free = head
        if head is None:
            fl = cls >> self._sl_bits
            row = self._rows[fl]
            if not row.bits:
                self._fl_bits |= 1 << fl
            row.bits |= 1 << (cls & self._sl_mask)
        else:
            head.prev_free = block
        self._heads[cls] = block
        self._extents += 1

    def _unlink(self, block: SegregatedBlock) -> None:
        """Take the free ``block`` off its class's list (it stays in the chain)."""
        cls = block.cls
        before = block.prev_free
        after = block.next_free
        if after is not None:
            after.prev_free = before
        if before is not None:
            before.next_free = after
        else:
            self._heads[cls] = after
            if after is None:
                fl = cls >> self._sl_bits
                row = self._rows[fl]
                row.bits ^= 1 << (cls & self._sl_mask)
                if not row.bits:
                    self._fl_bits ^= 1 << fl
        self._extents -= 1

    def _nonempty_from(self, cls: int) -> int:
        """The lowest non-empty class at or above ``cls``, or -1: two words looked at."""
        fl = cls >> self._sl_bits
        if fl < len(self._rows):
            bits = self._rows[fl].bits >> (cls & self._sl_mask)
            if bits:
                return cls + _lowest_bit(bits)
        rows = self._fl_bits >> (fl + 1)
        if not rows:
            return -1
        fl += 1 + _lowest_bit(rows)
        return (fl << self._sl_bits) + _lowest_bit(self._rows[fl].bits)

    def _new_block(self, start: int, size: int) -> SegregatedBlock:
        """A block for a new extent, from the spares when there is one (no allocation)."""
        spare = self._spare
        if spare:
            block = spare.pop()
            block.start = start
            block.size = size
            return block
        return SegregatedBlock(start, size)

    def _class_of(self, size: int) -> int:
        """The class a free extent of ``size`` bytes is binned in (``bin_class``)."""
        e = (size | self._small_mask).bit_length() - self._e_bias
        return (e << self._sl_bits) + (size >> e)

    # --- hot paths -------------------------------------------------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` from the first block of the lowest non-empty class that surely holds
        them."""
        if nbytes > self._capacity or nbytes <= 0:
            if nbytes <= 0:
                raise InvalidSizeError(f"cannot reserve {nbytes} bytes: not a positive size")
            return None
        e = (nbytes | self._small_mask).bit_length() - self._e_bias
        cls = (e << self._sl_bits) + ((nbytes + (1 << e) - 1) >> e)
        if cls >= self._classes:
            return None  # larger than the region
        block = self._heads[cls]
        if block is None:
            cls = self._nonempty_from(cls)
            if cls < 0:
                return self._reserve_slow(nbytes, alignment)
            block = self._heads[cls]
            assert block is not None
        start = block.start
        if start & (alignment - 1):
            return self._reserve_misaligned(nbytes, alignment)
        self._free -= nbytes
        rest = block.size - nbytes
        e = (rest | self._small_mask).bit_length() - self._e_bias
        rest_cls = (e << self._sl_bits) + (rest >> e)  # class 0 when nothing is left
        if rest_cls == cls:
            # The remainder stays in this class: the free block keeps its place in the list
            # (no bitmap touched) and moves up; the bytes taken get a block of their own below.
            taken = self._new_block(start, nbytes)
            taken.cls = _HELD
            below = block.prev_phys
            taken.prev_phys = below
            taken.next_phys = block
            if below is not None:
                below.next_phys = taken
            else:
                self._first = taken
            block.prev_phys = taken
            block.start = start + nbytes
            block.size = rest
        else:
            taken = block
            self._unlink(block)
            block.cls = _HELD
            if rest:
                block.size = nbytes
                remainder = self._new_block(start + nbytes, rest)
                above = block.next_phys
                remainder.prev_phys = block
                remainder.next_phys = above
                if above is not None:
                    above.prev_phys = remainder
                block.next_phys = remainder
                self._link(remainder, rest_cls)
        # Boxed once for the dict and the return (compiled: a fresh int object each time).
        start_obj: Any = start
        self._held[start_obj] = taken
        return start_obj  # type: ignore[no-any-return]

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, merged with its free neighbours."""
        held = self._held
        try:
            block = held.pop(offset)
        except KeyError:
            raise InvalidAddressError(
                f"offset {offset} is not held in this region", address=offset
            ) from None
        if block.size != nbytes:
            held[offset] = block  # refused: the state is unchanged
            raise SizeMismatchError(
                f"the block at offset {offset} holds {block.size} bytes, not {nbytes}",
                address=offset,
                given=nbytes,
                allocated=block.size,
            )
        self._free += nbytes
        below = block.prev_phys
        above = block.next_phys
        if below is not None and below.cls >= 0:
            # Merge into the free block below (and the one above, if free too).
            size = below.size + nbytes
            if above is not None and above.cls >= 0:
                self._unlink(above)
                size += above.size
                after = above.next_phys
                self._spare.append(above)
            else:
                after = above
            below.next_phys = after
            if after is not None:
                after.prev_phys = below
            self._spare.append(block)
            below.size = size
            block = below
        elif above is not None and above.cls >= 0:
            # Only the block above is free: it grows down over this one.
            size = above.size + nbytes
            above.start = offset
            above.size = size
            above.prev_phys = below
            if below is not None:
                below.next_phys = above
            else:
                self._first = above
            self._spare.append(block)
            block = above
        else:
            size = nbytes
        # ``_class_of`` written out (an interpreted call costs more than the arithmetic).
        e = (size | self._small_mask).bit_length() - self._e_bias
        cls = (e << self._sl_bits) + (size >> e)
        if cls != block.cls:  # a free block that grew out of its class, or the held one
            if block.cls != _HELD:
                self._unlink(block)
            self._link(block, cls)

    # --- slow paths ------------------------------------------------------------------------

    def _check_alignment(self, alignment: int) -> None:
        """Refuse an alignment that is not a positive power of two before it places anything.
        The fast path only ever takes the start of a free block, whatever the alignment; the
        slow paths compute offsets inside blocks, where a bad mask could land on held bytes."""
        if alignment <= 0 or alignment & (alignment - 1):
            raise InvalidAlignmentError(f"alignment {alignment} is not a positive power of two")

    def _reserve_misaligned(self, nbytes: int, alignment: int) -> int | None:
        """The extent that came up does not start aligned (by default: as ``_reserve_slow``)."""
        return self._reserve_slow(nbytes, alignment)

    def _reserve_slow(self, nbytes: int, alignment: int) -> int | None:
        """Scan the request's own class (whose extents may or may not be large enough), then
        every larger non-empty one, for an aligned fit; carve it."""
        self._check_alignment(alignment)
        if nbytes > self._free:
            return None
        mask = alignment - 1
        cls = self._nonempty_from(bin_class(nbytes, self._sl_bits))
        while cls >= 0:
            block = self._heads[cls]
            while block is not None:
                offset = (block.start + mask) & ~mask
                if offset + nbytes <= block.start + block.size:
                    return self._carve(block, offset, nbytes)
                block = block.next_free
            if cls + 1 >= self._classes:
                break
            cls = self._nonempty_from(cls + 1)
        return None

    def _carve(self, block: SegregatedBlock, offset: int, nbytes: int) -> int:
        """Take ``[offset, offset + nbytes)`` out of the free ``block``, which holds it."""
        self._unlink(block)
        self._free -= nbytes
        start = block.start
        end = start + block.size
        if offset > start:
            # The gap below stays free in ``block``; the bytes taken get a block above it.
            block.size = offset - start
            self._link(block, self._class_of(offset - start))
            taken = self._new_block(offset, nbytes)
            taken.prev_phys = block
            taken.next_phys = block.next_phys
            if block.next_phys is not None:
                block.next_phys.prev_phys = taken
            block.next_phys = taken
        else:
            taken = block
            taken.size = nbytes
        taken.cls = _HELD
        if offset + nbytes < end:
            rest = end - offset - nbytes
            remainder = self._new_block(offset + nbytes, rest)
            remainder.prev_phys = taken
            remainder.next_phys = taken.next_phys
            if taken.next_phys is not None:
                taken.next_phys.prev_phys = remainder
            taken.next_phys = remainder
            self._link(remainder, self._class_of(rest))
        self._held[offset] = taken
        return offset

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Total free bytes."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free extent (0 when none): the top class's largest member."""
        if not self._fl_bits:
            return 0
        fl = self._fl_bits.bit_length() - 1
        cls = (fl << self._sl_bits) + self._rows[fl].bits.bit_length() - 1
        largest = 0
        block = self._heads[cls]
        while block is not None:
            largest = max(largest, block.size)
            block = block.next_free
        return largest

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        return self._extents

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)``, sorted by offset, after checking the
        whole structure (raises :class:`~tensorarena.errors.InvariantError` if it is corrupt)."""
        check_structure(self)
        extents = []
        block = self._first
        while block is not None:
            if block.cls != _HELD:
                extents.append((block.start, block.size))
            block = block.next_phys
        return extents

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(capacity={self._capacity}, free={self._free}, "
            f"extents={self._extents}, held={len(self._held)})"
        )
