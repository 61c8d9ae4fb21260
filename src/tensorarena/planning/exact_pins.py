"""Pinned buffers in the list engine's node: which candidate placements an unplaced pin forbids.

The list node (:mod:`~tensorarena.planning.exact_lists`) takes a pinned buffer's pin as its
offset to try, and kills the node when a placed buffer already overlaps an unplaced pin or the
canonical order has passed one (both in its pass over the buffers). What is left is here, the
same rule as :meth:`~tensorarena.planning.exact_node.Search.pinned_lows`: a free buffer is no
candidate while its lowest offset would overlap, in time and in bytes, a pin not yet placed; and
with canonical placements nothing may come after the lowest unplaced pin's key (the pin would then
be passed). A separate module keeps the list node's file to its search; it imports nothing, so
mypyc compiles it with the list node or runs it interpreted, the same either way.
"""

from __future__ import annotations

__all__ = ["unblocked"]


def unblocked(keys: list[int], n: int, by_rank: list[int], pinned: list[int], pin: list[int],
              size: list[int], first: list[int], last: list[int], bar: int) -> list[int]:
    """The candidate keys (``offset * n + rank``, sorted) that no unplaced pin forbids.

    ``pinned``: the node's unplaced pinned buffers; ``pin``, ``size``, ``first``, ``last``: every
    buffer's pin (-1 when free), bytes and sections ``[first, last)``; ``bar``: the lowest
    unplaced pin's key when placements are canonical (keys above it are cut), else -1.
    """
    kept: list[int] = []
    for key in keys:
        if bar >= 0 and key > bar:
            break  # sorted: every later key is above it too
        offset = key // n
        i = by_rank[key - offset * n]
        if pin[i] < 0:
            top = offset + size[i]
            lo = first[i]
            hi = last[i]
            clash = False
            for j in pinned:
                p = pin[j]
                if lo < last[j] and first[j] < hi and p < top and offset < p + size[j]:
                    clash = True
                    break
            if clash:
                continue
        kept.append(key)
    return kept
