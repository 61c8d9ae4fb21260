"""Preprocessing for the exact planner: time sections, spans, overlaps, cuts and preorders.

Time is cut at every distinct start and end into *sections* ``[t_k, t_k+1)``; inside one section
the set of live buffers does not change, so a buffer's lifetime is a contiguous range of section
indices ``[first, last)``. Everything the search needs about time is then integer arrays: the live
bytes per section (the per-section lower bound), the pairwise overlap lists (whose tops raise a
buffer's lowest offset) and the *cuts* (how many buffers span the boundary between two
neighbouring sections; a zero cut splits the problem into independent time windows).

Zero-byte buffers never collide with anything in space, so they are left out of the search and
placed at offset 0. A pinned buffer (``Buffer.offset``) keeps its offset in ``pin`` (-1: free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tensorarena.planning.problem import Buffer

__all__ = ["PREORDERS", "Sections", "build_sections"]

IntArray = npt.NDArray[np.int64]

#: Static preorders tried in turn (round robin), as in minimalloc: W = lifetime width,
#: A = area (bytes x time), T = the largest live total among the buffer's sections; larger first.
PREORDERS: tuple[str, ...] = ("WAT", "TAW", "TWA")


@dataclass(frozen=True, slots=True)
class Sections:
    """The search's view of the non-empty buffers of a problem (indices into ``members``)."""

    members: tuple[int, ...]  #: index in ``problem.buffers`` of each searched buffer
    size: IntArray  #: bytes of each searched buffer
    align: IntArray  #: alignment of each searched buffer
    first: IntArray  #: first section of each buffer
    last: IntArray  #: one past its last section
    width: IntArray  #: lifetime length in time units
    overlaps: tuple[npt.NDArray[np.int32], ...]  #: buffers live at the same time as each one
    total: IntArray  #: live bytes per section
    cuts: IntArray  #: buffers spanning the boundary between sections k and k + 1
    granule: int  #: divides every size and every alignment above 1, so every canonical height
    pin: IntArray  #: each searched buffer's pinned offset, -1 for a free one

    def __len__(self) -> int:
        return len(self.members)

    @property
    def n_sections(self) -> int:
        """Number of time sections."""
        return len(self.total)

    def peak(self) -> int:
        """The largest live total over all sections (the problem's lower bound)."""
        return int(self.total.max()) if len(self.total) else 0

    def preorder_rank(self, heuristic: str) -> IntArray:
        """Rank of every buffer under a static preorder named by letters of W, A, T, Z, L."""
        n = len(self.members)
        section_max = np.zeros(n, dtype=np.int64)
        for i in range(n):
            section_max[i] = self.total[self.first[i] : self.last[i]].max()
        order = self.preorder(heuristic, np.arange(n, dtype=np.int64), section_max)
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64)
        return rank

    def preorder(self, heuristic: str, members: IntArray, section_max: IntArray) -> IntArray:
        """``members`` sorted by a preorder: larger first on each letter, index breaks ties.

        W = lifetime width, A = area (bytes x time), T = ``section_max`` (one per member: the
        largest live total among its sections, which the search recomputes for the windows it
        splits off), Z = size, L = number of sections.
        """
        keys = {
            "W": self.width[members],
            "A": self.width[members] * self.size[members],
            "T": section_max,
            "Z": self.size[members],
            "L": self.last[members] - self.first[members],
        }
        # np.lexsort sorts by the last key first; negate for "larger first", index breaks ties.
        columns = [members, *(-keys[letter] for letter in reversed(heuristic))]
        return members[np.lexsort(columns)]


def build_sections(buffers: tuple[Buffer, ...]) -> Sections:
    """Sections, spans, overlaps and cuts for the buffers with at least one byte."""
    members = tuple(i for i, b in enumerate(buffers) if b.nbytes > 0)
    live = [buffers[i] for i in members]
    n = len(live)
    times = sorted({b.start for b in live} | {b.end for b in live})
    index = {t: k for k, t in enumerate(times)}
    n_sections = max(len(times) - 1, 0)
    first = np.array([index[b.start] for b in live], dtype=np.int64)
    last = np.array([index[b.end] for b in live], dtype=np.int64)
    size = np.array([b.nbytes for b in live], dtype=np.int64)
    align = np.array([b.alignment for b in live], dtype=np.int64)
    width = np.array([b.end - b.start for b in live], dtype=np.int64)
    pin = np.array([-1 if b.offset is None else b.offset for b in live], dtype=np.int64)

    # Difference arrays turn n range-additions into two prefix sums.
    total_diff = np.zeros(n_sections + 1, dtype=np.int64)
    np.add.at(total_diff, first, size)
    np.subtract.at(total_diff, last, size)
    total = np.cumsum(total_diff)[:n_sections]
    cut_diff = np.zeros(max(n_sections, 1), dtype=np.int64)
    spanning = last - first > 1
    np.add.at(cut_diff, first[spanning], 1)
    np.subtract.at(cut_diff, last[spanning] - 1, 1)
    cuts = np.cumsum(cut_diff)[: max(n_sections - 1, 0)]

    # Overlaps, one vectorised comparison per buffer: far cheaper than Python lists of pairs when
    # hundreds of buffers are live at once (int32 indices halve the memory of dense problems).
    starts = np.array([b.start for b in live], dtype=np.int64)
    ends = np.array([b.end for b in live], dtype=np.int64)
    overlaps = tuple(
        np.flatnonzero((starts < ends[i]) & (ends > starts[i])).astype(np.int32)
        for i in range(n)
    )
    overlaps = tuple(ov[ov != i] for i, ov in enumerate(overlaps))

    # Offsets are 0, tops (sums of sizes) or multiples of an alignment above 1; alignment 1 adds
    # nothing, so it must not drag the granule down to 1.
    granule = 0
    for b in live:
        granule = math.gcd(granule, b.nbytes, b.alignment if b.alignment > 1 else 0)
        if b.offset is not None:
            granule = math.gcd(granule, b.offset)  # a pin's top is then on the granule too
    return Sections(
        members=members,
        size=size,
        align=align,
        first=first,
        last=last,
        width=width,
        overlaps=overlaps,
        total=total,
        cuts=cuts,
        granule=max(granule, 1),
        pin=pin,
    )
