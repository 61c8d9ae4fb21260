"""The ring of an arena's recently freed addresses, which tells a double free from a foreign
address.

Freed addresses are remembered in a ring of the last ``recent_frees`` (as the upstream resources
do, ``memory/live_blocks.py``): the k-th free writes slot ``k % recent_frees``, so the count of
frees is the ring's index and the good path pays one list store (the ring grows to its size as
frees come: a pool may hold many arenas that free little). Its length is the arena's own,
:func:`recent_frees_length` of its capacity: the power of two covering the blocks of the default
alignment the arena can hold (``capacity // 256``), 16 at least, :data:`RECENT_FREES` at most. A
ring of the largest length in every arena cost a pool grown to many small arenas several times
the memory of rings sized so; the per-arena mask costs the compiled hot path nothing
measurable (``bench alloc``, ``bench/RESULTS.md``). Only an error looks in the ring (a scan in C),
to tell a double free from a foreign address; an address freed longer ago is refused as not live. A
ring entry whose address was handed out again is shadowed by the arena's map of live blocks, which
is looked up first. Tombstones kept in the map instead (the earlier design) grew it with every
address ever used (tens of entries for each live block on ``bench alloc``, several times the ring's
memory over a long replay) and its lookups missed the cache: compiled, the ring is faster a pair
except on buddy (its map stayed small); pure, a wash (``bench/RESULTS.md``).

The arena's ``deallocate`` stores into the ring itself (one list store); :func:`remember_free`
is its slow path, which grows the ring.
"""

from __future__ import annotations

from typing import Final

__all__ = ["RECENT_FREES", "recent_frees_length", "remember_free"]

#: The most freed addresses an arena remembers to tell a double free from a foreign address
#: (a power of two: the ring's index is the count of frees masked). A smaller arena remembers
#: fewer: see :func:`recent_frees_length`.
RECENT_FREES: Final = 4096
#: The fewest freed addresses an arena remembers, however small.
_MIN_RECENT_FREES: Final = 16
#: The arena's default alignment: the size of the smallest block it usually holds.
_BLOCK: Final = 256
if RECENT_FREES & (RECENT_FREES - 1):  # pragma: no cover - guards the mask in deallocate()
    raise ImportError("RECENT_FREES must be a power of two")


def recent_frees_length(capacity: int) -> int:
    """How many freed addresses an arena of ``capacity`` bytes remembers: the power of two at
    least ``capacity // 256`` (the blocks of the default alignment it can hold at once), and at
    least 16, at most :data:`RECENT_FREES`."""
    blocks = max(_MIN_RECENT_FREES, capacity // _BLOCK)
    return min(RECENT_FREES, 1 << (blocks - 1).bit_length())


def remember_free(recent: list[int | None], mask: int, count: int, address: int) -> None:
    """Put ``address``, the ``count``-th free, in its slot of the ring ``recent`` (of length
    ``mask + 1`` once grown), growing the ring to that slot."""
    slot = count & mask
    if slot >= len(recent):
        size = max(8, 2 * len(recent))
        while size <= slot:
            size *= 2
        recent.extend([None] * (min(size, mask + 1) - len(recent)))
    recent[slot] = address
