"""The structure check of the segregated engine (:mod:`tensorarena.core._segregated`).

Run by ``free_extents`` (so by an arena's expensive debug checks, and by tests): it walks the chain
of blocks from offset 0 and every class's free list, and raises
:class:`~tensorarena.errors.InvariantError` at the first disagreement between the chain, the
lists, the two levels of bitmap words, the map of held blocks and the counters. Every walk is
bounded, so a corrupted link that makes a cycle is reported, not followed forever. O(blocks +
classes); interpreted even in the compiled build (it is not on a hot path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorarena.debug import check

if TYPE_CHECKING:
    from tensorarena.core._segregated import SegregatedBlock, SegregatedExtents

__all__ = ["check_structure"]


def _class_of(nbytes: int, sl_bits: int) -> int:
    """The class of a free extent of ``nbytes``: ``bin_class``'s arithmetic, written again so
    that the check does not trust the engine's tables."""
    e = (nbytes | ((2 << sl_bits) - 1)).bit_length() - sl_bits - 1
    return (e << sl_bits) + (nbytes >> e)


def check_structure(engine: SegregatedExtents) -> None:
    """Check the chain, the free lists, the bitmaps and the counters against each other."""
    chain: list[SegregatedBlock] = []
    free_ids: set[int] = set()
    position = 0
    block = engine._first
    previous: SegregatedBlock | None = None
    while block is not None:
        check(len(chain) <= 2 * len(engine._held) + engine._extents + 1, "the chain loops")
        check(block.start == position and block.size > 0, f"a gap or overlap at {position}")
        check(block.prev_phys is previous, f"a broken back link at {position}")
        if block.cls < 0:
            check(engine._held.get(block.start) is block, f"held block {position} not mapped")
        else:
            check(previous is None or previous.cls < 0, f"free extents adjoin at {position}")
            check(
                block.cls == _class_of(block.size, engine._sl_bits),
                f"free extent at {position} is in the wrong class",
            )
            free_ids.add(id(block))
        chain.append(block)
        position += block.size
        previous = block
        block = block.next_phys
    check(position == engine._capacity, "the chain does not cover the region")
    check(len(chain) == len(engine._held) + len(free_ids), "a held block is not in the chain")
    listed = 0
    free = 0
    for cls, head in enumerate(engine._heads):
        fl = cls >> engine._sl_bits
        bit = (engine._rows[fl].bits >> (cls & engine._sl_mask)) & 1
        check(bit == (head is not None), f"class {cls}'s bit disagrees with its list")
        before: SegregatedBlock | None = None
        block = head
        while block is not None:
            check(listed < len(free_ids), "a free list loops or lists a held block")
            check(id(block) in free_ids and block.cls == cls, f"class {cls} lists a stranger")
            check(block.prev_free is before, f"class {cls}'s list has a broken back link")
            listed += 1
            free += block.size
            before = block
            block = block.next_free
    for fl, row in enumerate(engine._rows):
        check((engine._fl_bits >> fl) & 1 == (row.bits != 0), f"row {fl}'s bit disagrees")
    check(listed == len(free_ids) == engine._extents, "free extents missing from the lists")
    check(free == engine._free, "free bytes disagree with the free extents")
