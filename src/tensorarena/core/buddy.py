"""Buddy allocation: power-of-two blocks that split in halves and merge with their buddy.

Every reservation is rounded up to a power of two of at least ``min_block`` bytes and served by a
block of exactly that size, so a block of ``2**k`` bytes always sits at a multiple of ``2**k``
(alignment comes for free: the arena rounds a request up to a multiple of its alignment, so the
block is never smaller than the alignment). Free blocks are kept in one set per order; a bitmap of
the non-empty orders finds the smallest order that can be split in O(1). On release a block merges
with its buddy (``offset ^ size``) while the buddy is free at the same order, so the cost of both
operations is O(number of orders).

The region need not be a power of two: it is covered by the largest power-of-two blocks that fit,
in decreasing size from offset 0 (bytes below ``min_block`` at the end stay unused and are not
counted as free). Each of those top blocks sits at a multiple of twice its size and its buddy
position lies in the smaller blocks above it, so top blocks never merge with each other.

Coalescing, for a buddy system, means this: freeing everything restores the *initial block set*
(one block when the capacity is a power of two). Adjacent free blocks that are not buddies stay
separate extents, so ``free_extent_count`` counts free blocks and ``free_bytes`` their bytes; the
rounding waste inside reserved blocks is neither free nor requested.
"""

from __future__ import annotations

from typing import ClassVar

from tensorarena.core._arena_errors import size_error
from tensorarena.core._builtin import BuiltinStrategy

__all__ = ["Buddy"]

#: Smallest block by default: the arena's default alignment, so small requests waste little.
DEFAULT_MIN_BLOCK = 256


class Buddy(BuiltinStrategy):
    """Binary buddy allocator over ``[0, capacity)``: power-of-two blocks, buddy merging."""

    name: ClassVar[str] = "buddy"
    coalesces: ClassVar[bool] = True

    def __init__(self, capacity: int, *, min_block: int = DEFAULT_MIN_BLOCK) -> None:
        if min_block <= 0 or min_block & (min_block - 1):
            raise ValueError(f"min_block must be a positive power of two, got {min_block!r}")
        self._capacity = capacity
        self._min_block = min_block
        self._min_order = min_block.bit_length() - 1
        max_order = max(capacity.bit_length() - 1, self._min_order)
        self._blocks: list[set[int]] = [set() for _ in range(max_order + 1)]
        self._bitmap = 0
        self._free = 0
        self._initial = self._cover(capacity)
        self.reset()

    def _cover(self, capacity: int) -> list[tuple[int, int]]:
        """The initial blocks: the binary digits of the usable capacity, largest first."""
        usable = capacity & -self._min_block
        blocks = []
        offset = 0
        for order in range(usable.bit_length() - 1, self._min_order - 1, -1):
            if usable >> order & 1:
                blocks.append((offset, order))
                offset += 1 << order
        return blocks

    @property
    def capacity(self) -> int:
        """Size of the managed region in bytes."""
        return self._capacity

    @property
    def min_block(self) -> int:
        """The smallest block handed out, in bytes."""
        return self._min_block

    def block_size(self, nbytes: int) -> int:
        """The size of the block that serves a request of ``nbytes``."""
        return max(1 << (nbytes - 1).bit_length(), self._min_block)

    def initial_extents(self) -> list[tuple[int, int]]:
        """The free blocks of an empty region as ``(offset, nbytes)``: what freeing all restores."""
        return [(offset, 1 << order) for offset, order in self._initial]

    def reset(self) -> None:
        """Forget every reservation: the initial block set is free again."""
        for blocks in self._blocks:
            blocks.clear()
        self._bitmap = 0
        self._free = 0
        for offset, order in self._initial:
            self._blocks[order].add(offset)
            self._bitmap |= 1 << order
            self._free += 1 << order

    # --- hot paths -------------------------------------------------------------------------

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take a block of ``nbytes`` rounded up to a power of two; split larger ones as needed."""
        if nbytes <= 0:  # called directly, not through an Arena: refuse, change nothing
            raise size_error(nbytes)
        order = (nbytes - 1).bit_length()
        if order < self._min_order:
            order = self._min_order
        m = self._bitmap >> order
        if not m:
            return None
        found = order + (m & -m).bit_length() - 1
        blocks = self._blocks
        free_blocks = blocks[found]
        offset = free_blocks.pop()
        bitmap = self._bitmap
        if not free_blocks:
            bitmap ^= 1 << found
        # Split down: each step keeps the lower half and frees the upper one, its buddy.
        while found > order:
            found -= 1
            blocks[found].add(offset + (1 << found))
            bitmap |= 1 << found
        self._bitmap = bitmap
        self._free -= 1 << order
        return offset

    def release(self, offset: int, nbytes: int) -> None:
        """Give back the block at ``offset``, merging it with its buddy as long as that is free."""
        order = (nbytes - 1).bit_length()
        if order < self._min_order:
            order = self._min_order
        self._free += 1 << order
        blocks = self._blocks
        bitmap = self._bitmap
        while True:
            size = 1 << order
            buddies = blocks[order]
            buddy = offset ^ size
            if buddy not in buddies:
                break
            buddies.remove(buddy)
            if not buddies:
                bitmap ^= size  # an order's bit is 1 << order, the block size itself
            offset &= ~size
            order += 1
        blocks[order].add(offset)
        self._bitmap = bitmap | (1 << order)

    # --- queries ---------------------------------------------------------------------------

    def free_bytes(self) -> int:
        """Bytes in free blocks."""
        return self._free

    def largest_free(self) -> int:
        """Size of the largest free block (0 when none): the largest request that can succeed."""
        return 1 << (self._bitmap.bit_length() - 1) if self._bitmap else 0

    def free_extent_count(self) -> int:
        """Number of free blocks (adjacent non-buddies count separately)."""
        return sum(len(blocks) for blocks in self._blocks)

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free block as ``(offset, nbytes)``, sorted by offset."""
        return sorted(
            (offset, 1 << order)
            for order, blocks in enumerate(self._blocks)
            for offset in blocks
        )

    def __repr__(self) -> str:
        return (
            f"Buddy(capacity={self._capacity}, min_block={self._min_block}, free={self._free}, "
            f"blocks={self.free_extent_count()})"
        )
