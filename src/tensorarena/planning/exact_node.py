"""One node of the exact search and its techniques, each a method named after it.

A depth-first search places buffers one at a time, each at its *lowest offset* (the aligned top
of the highest placed buffer that shares time with it), so a node only ever chooses *which*
buffer comes next. The techniques, each a switch in
:class:`~tensorarena.planning.exact_params.SolverParams` (see
:mod:`~tensorarena.planning.exact_search` for why each is sound):

- :meth:`Search.canonical_candidates` (``canonical_only``): non-decreasing (offset, rank) order;
- :meth:`Search.check_dominance`: nothing at or above the lowest top an unplaced buffer reaches;
- :meth:`Search.section_inference`: every section's unplaced bytes fit above the offset;
- :meth:`Search.unallocated_floor` (or :meth:`Search.scattered_floor` on large problems):
  every section's unplaced bytes fit above its floor;
- :meth:`Search.dynamic_decomposition` and :meth:`Search.split` (``window_preordering``);
- :meth:`Search.remembered_failure`, :meth:`Search.known_nogood` and
  :meth:`Search.remember_failure` (``remember_failures``, ``nogoods``).

Pinned buffers (:meth:`Search.pinned_lows`): a compact plan listed by offset still has every free
buffer at its lowest offset, and each pinned one at its pin, so a pinned buffer is a candidate at
its pin (dead once something placed overlaps it, or once the canonical order has passed it), and a
free buffer is not a candidate while its lowest offset would overlap an unplaced pin. Dominance,
decomposition and nogoods assume every buffer can go at its lowest offset; with pins they are off.

State lives in preallocated NumPy arrays (lowest offsets, unplaced mask, unplaced bytes per
section, cuts) updated in place by :meth:`Search.place` and undone by :meth:`Search.unplace`;
a node allocates only small index arrays. Each technique binds what it reads to locals first;
the node itself is the only generator, driven by :func:`drive` on a list rather than the
interpreter's stack (no ``sys.setrecursionlimit``, a process-wide setting every thread shares):
each node *yields* the call it would have made and is sent the child's answer. That costs a
generator and a ``StopIteration`` per node, a few percent of a node.

:mod:`~tensorarena.planning.exact_lists` is the same node on lists of ints for mypyc to compile;
a change to a technique here must be made there too (tests/planning/test_exact_engines.py
compares the two node for node).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from hashlib import blake2b
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from tensorarena.planning.exact_params import SolverParams, Status
from tensorarena.planning.exact_sections import Sections

__all__ = [
    "CLOCK_EVERY", "CLOCK_WORK", "GROUP_LIMIT", "MEMBERS_LIMIT", "MEMORY_LIMIT", "NOGOOD_CELLS",
    "Search", "Step", "drive", "section_members",
]

FOUND, EXHAUSTED, STOPPED = Status.FOUND, Status.EXHAUSTED, Status.STOPPED

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: One node of the search: yields the nodes it would have called, is sent their status, and
#: returns its own (see :func:`drive`).
Step = Generator["Step", Status, Status]

# How many nodes pass between two looks at the clock: a clock read costs about as much as a node
# of a small problem. A node costs time linear in the problem, so large ones look more often.
CLOCK_EVERY = 256
CLOCK_WORK = 60_000  # buffers x nodes between two looks at the clock, at most
# Most nogoods kept per set of unplaced buffers (each check scans them all).
GROUP_LIMIT = 64
# Most failed states remembered (about 150 bytes each) before the memory starts afresh.
MEMORY_LIMIT = 1_000_000
# Most lowest offsets kept in nogoods (8 bytes each: a row per nogood, a column per unplaced
# buffer), so that large problems cannot fill the memory with them.
NOGOOD_CELLS = 16_000_000
# Largest section → members table (sum of every buffer's section count) built for the floors.
MEMBERS_LIMIT = 4_000_000
_NEVER = 1 << 62


def drive(root: Step) -> Status:
    """Run the node ``root`` and every node it yields, depth first, on a list, not the C stack.

    A node yields a child node and is sent back the child's status when the child returns.
    """
    stack = [root]
    push, pop = stack.append, stack.pop
    node = root
    reply: Status | None = None
    while True:
        try:
            child = node.send(reply)  # type: ignore[arg-type]  # None starts a fresh node
        except StopIteration as done:
            pop()
            if not stack:
                status: Status = done.value
                return status
            node = stack[-1]
            reply = done.value
            continue
        push(child)
        node = child
        reply = None


def section_members(sections: Sections) -> tuple[npt.NDArray[np.int32], IntArray] | None:
    """Every section's member buffers (placed or not), section by section, and where each
    section's run starts (one more entry: the end); None when the table would pass
    :data:`MEMBERS_LIMIT` entries."""
    lengths = sections.last - sections.first
    count = int(lengths.sum())
    if count > MEMBERS_LIMIT:
        return None
    owner = np.repeat(np.arange(len(sections), dtype=np.int32), lengths)
    where = np.arange(count) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    where += np.repeat(sections.first, lengths)
    start = np.zeros(sections.n_sections + 1, dtype=np.int64)
    np.cumsum(np.bincount(where, minlength=sections.n_sections), out=start[1:])
    return owner[np.argsort(where, kind="stable")], start


class Search:
    """One depth-first search under one static preorder and an optional node budget.

    Everything a node touches is preallocated here; each technique is a method of its own.
    """

    def __init__(
        self,
        params: SolverParams,
        sections: Sections,
        capacity: int,
        rank: IntArray,
        heuristic: str,
        deadline: float,
        failed: dict[bytes, int],
        nogoods: dict[bytes, IntArray],
        stored: list[int],
        tick: Callable[[int], None] | None,
    ) -> None:
        sec = self.sections = sections
        n = self.n = len(sec)
        self.cap = capacity
        # The switches, as plain attributes (one lookup each on the hot path).
        self.canonical = params.canonical_only
        self.inference = params.section_inference and params.canonical_only
        self.dominance = params.check_dominance and params.canonical_only
        self.floors = params.unallocated_floor
        self.decompose = params.dynamic_decomposition
        self.fresh_windows = params.window_preordering
        self.remember = params.remember_failures
        self.use_nogoods = params.nogoods
        self.pin = sec.pin
        self.pinned = bool((sec.pin >= 0).any())
        if self.pinned:
            self.dominance = self.decompose = self.use_nogoods = False
        self.size = sec.size
        self.size_l: list[int] = sec.size.tolist()
        self.first, self.last = sec.first, sec.last
        self.first_l: list[int] = sec.first.tolist()
        self.last_l: list[int] = sec.last.tolist()
        self.rank = rank
        self.by_rank: list[int] = np.argsort(rank).tolist()
        self.heuristic = heuristic
        self.overlaps = sec.overlaps
        self.aligned = bool((sec.align > 1).any())
        mask = sec.align - 1
        # Per-neighbour alignment masks, built only when some alignment is above 1.
        self.ov_mask = [mask[ov] for ov in sec.overlaps] if self.aligned else []
        self.ov_keep = [~m for m in self.ov_mask]
        self.minoff = np.zeros(n, dtype=np.int64)
        self.free = np.ones(n, dtype=np.bool_)
        # Unplaced bytes per section, with one spare section at the end so that ``reduceat``
        # may start a range at a buffer's ``last``.
        self.total_ext = np.zeros(sec.n_sections + 1, dtype=np.int64)
        self.total_ext[:-1] = sec.total
        self.total = self.total_ext[:-1]
        self.spans = np.stack([sec.first, sec.last], axis=1)
        # Section → member buffers (placed or not), when that table stays small.
        table = section_members(sec)
        self.by_section: npt.NDArray[np.int32] | None = None if table is None else table[0]
        self.section_start = np.zeros(sec.n_sections + 1, dtype=np.int64)
        if table is not None:
            self.section_start = table[1]
        self.cuts = sec.cuts.copy()
        self.offsets = np.zeros(n, dtype=np.int64)
        self.deadline = deadline
        self.clock_every = max(1, min(CLOCK_EVERY, CLOCK_WORK // n))
        self.failed = failed
        self.nogoods = nogoods
        self.stored = stored
        self.tick = tick
        self.hits = 0  #: states refuted by memory (failures and nogoods)
        self.nodes = 0
        self.node_limit = _NEVER
        self.hard_limit = _NEVER
        self.timed_out = False

    def run(
        self, part: BoolArray, lo: int, hi: int, node_limit: int | None, hard_limit: int | None
    ) -> Status:
        """Solve the time window ``[lo, hi)`` (buffers ``part``) within ``node_limit`` nodes.

        ``node_limit`` is the round robin's budget, checked with the clock (a few hundred nodes
        more do no harm); ``hard_limit`` is the caller's, checked at every node.
        """
        self.nodes = 0
        self.node_limit = node_limit if node_limit is not None else _NEVER
        self.hard_limit = hard_limit if hard_limit is not None else _NEVER
        self.timed_out = False
        return drive(self._node(part.copy(), lo, hi, -1, self.rank, self.by_rank, b""))

    # -----------------------------------------------------------------------------------------
    # The node
    # -----------------------------------------------------------------------------------------

    def _node(
        self,
        part: BoolArray,
        lo: int,
        hi: int,
        last_key: int,
        rank: IntArray,
        by_rank: list[int],
        tag: bytes,
    ) -> Step:
        if self.out_of_budget():
            return STOPPED
        window = self.total[lo:hi]
        table = self.by_section is not None
        if self.floors and table and self.unallocated_floor(lo, hi, window):
            return EXHAUSTED
        idx = (part & self.free).nonzero()[0]
        if not len(idx):
            return FOUND
        low = self.minoff[idx]
        blocked = None
        if self.pinned:
            pinned = self.pinned_lows(idx, low, last_key, rank)
            if pinned is None:
                return EXHAUSTED
            low, blocked = pinned
        if self.floors and not table and self.scattered_floor(idx, low, lo, hi, window):
            return EXHAUSTED
        state = group_key = b""
        group = None
        if self.remember:
            state = blake2b(tag + idx.tobytes() + low.tobytes(), digest_size=16).digest()
            if self.remembered_failure(state, last_key):
                return EXHAUSTED
        if self.use_nogoods:
            group_key = blake2b(idx.tobytes(), digest_size=16).digest()
            group = self.nogoods.get(group_key)
            if group is not None and self.known_nogood(group, low):
                return EXHAUSTED
        limit = _NEVER
        if self.dominance:
            limit = self.check_dominance(idx, low)
        if self.inference:
            limit = min(limit, self.section_inference(window))
        keys, clean = self.canonical_candidates(idx, low, last_key, rank, limit, blocked)
        n = self.n
        canonical = self.canonical
        decompose = self.decompose
        for key in keys:
            offset, r = divmod(key, n)
            i = by_rank[r]
            prior = int(self.minoff[i])  # a pinned buffer's offset is not its lowest offset
            before = self.place(i, offset)
            zeros = self.dynamic_decomposition(i) if decompose else None
            if zeros:
                status = yield self.split(part, lo, hi, zeros, tag)
            else:
                status = yield self._node(part, lo, hi, key if canonical else -1, rank, by_rank,
                                          tag)
            if zeros is not None:
                self.undo_decomposition(i)
            self.unplace(i, prior, before)
            if status is not EXHAUSTED:
                return status
        self.remember_failure(state, group_key, group, low, last_key, clean)
        return EXHAUSTED

    def out_of_budget(self) -> bool:
        """Count this node; True when the caller's budget, the clock or the round ran out."""
        if self.nodes >= self.hard_limit:
            return True
        self.nodes += 1
        if self.nodes % self.clock_every == 0:
            if time.monotonic() > self.deadline:
                self.timed_out = True
                return True
            if self.tick is not None:
                self.tick(self.nodes)
            if self.nodes > self.node_limit:
                return True
        return False

    # -----------------------------------------------------------------------------------------
    # Bounds
    # -----------------------------------------------------------------------------------------

    def unallocated_floor(self, lo: int, hi: int, window: IntArray) -> bool:
        """True when some section's unplaced bytes cannot fit above its floor.

        Members of every section, listed section by section: one gather and one segmented
        minimum. Placed buffers hold ``cap`` (no constraint); the clip keeps a section without
        unplaced bytes (or without members) harmless.
        """
        start = self.section_start
        by_section = self.by_section
        assert by_section is not None
        a, b = start[lo], start[hi]
        floor = np.minimum.reduceat(self.minoff[by_section[a:b]], start[lo:hi] - a)
        cap = self.cap
        np.minimum(floor, cap, out=floor)
        return int((floor + window).max()) > cap

    def scattered_floor(self, idx: IntArray, low: IntArray, lo: int, hi: int,
                        window: IntArray) -> bool:
        """:meth:`unallocated_floor` by one scatter over every (section, unplaced buffer) pair,
        for problems whose section table would be too large; its temporaries die on return."""
        starts = self.first[idx]
        lengths = self.last[idx] - starts
        ends = np.cumsum(lengths)
        where = np.arange(int(ends[-1])) + np.repeat(starts - ends + lengths - lo, lengths)
        floor = np.full(hi - lo, self.cap, dtype=np.int64)
        np.minimum.at(floor, where, np.repeat(low, lengths))
        return int((floor + window).max()) > self.cap

    def section_inference(self, window: IntArray) -> int:
        """Offsets below this leave room above them for every section's unplaced bytes."""
        return self.cap - int(window.max()) + 1

    def check_dominance(self, idx: IntArray, low: IntArray) -> int:
        """Offsets below this: the lowest top any unplaced buffer could reach."""
        return int((low + self.size[idx]).min())

    def canonical_candidates(self, idx: IntArray, low: IntArray, last_key: int, rank: IntArray,
                             limit: int, blocked: BoolArray | None = None
                             ) -> tuple[list[int], bool]:
        """The (offset, rank) keys to try, in order, and whether the canonical order cut none.

        With ``canonical_only`` a key must exceed the one placed last; the offset must stay below
        ``limit``; and without section inference to guarantee it, the buffer must fit below
        the capacity.
        """
        keys = low * self.n + rank[idx]
        clean = True
        allowed = low < limit
        if self.canonical:
            clean = int(keys.min()) > last_key
            allowed &= keys > last_key
        if not self.inference:
            allowed &= low + self.size[idx] <= self.cap
        if blocked is not None:
            allowed &= ~blocked
        chosen = keys[allowed]
        chosen.sort()
        return chosen.tolist(), clean

    def pinned_lows(self, idx: IntArray, low: IntArray, last_key: int, rank: IntArray
                    ) -> tuple[IntArray, BoolArray] | None:
        """The unplaced buffers' offsets to try (a pinned one's pin) and which free ones an
        unplaced pin blocks; None when a pin can no longer be kept (the node is dead)."""
        pin = self.pin[idx]
        fixed = pin >= 0
        if not fixed.any():
            return low, np.zeros(len(idx), dtype=np.bool_)
        if (low[fixed] > pin[fixed]).any():
            return None  # a placed buffer overlaps an unplaced pin
        low = np.where(fixed, pin, low)
        keys = None
        if self.canonical:
            keys = low * self.n + rank[idx]
            if (keys[fixed] <= last_key).any():
                return None  # the canonical order has passed a pin it never placed
        size = self.size[idx]
        p, f = idx[fixed], ~fixed
        # free i (rows) against unplaced pinned j (columns): shared time and shared bytes
        shared = (self.first[idx][f, None] < self.last[p][None, :]) & (
            self.first[p][None, :] < self.last[idx][f, None])
        space = (pin[fixed][None, :] < (low + size)[f, None]) & (
            low[f, None] < (pin + size)[fixed][None, :])
        blocked = np.zeros(len(idx), dtype=np.bool_)
        blocked[f] = (shared & space).any(axis=1)
        if keys is not None:
            # Anything placed past the lowest unplaced pin would pass it: a dead branch.
            blocked |= keys > int(keys[fixed].min())
        return low, blocked

    # -----------------------------------------------------------------------------------------
    # Placement and decomposition
    # -----------------------------------------------------------------------------------------

    def place(self, i: int, offset: int) -> IntArray:
        """Put buffer ``i`` at ``offset``; return its neighbours' lowest offsets before."""
        nbytes = self.size_l[i]
        top = offset + nbytes
        ov = self.overlaps[i]
        minoff = self.minoff
        before = minoff[ov]
        if self.aligned:
            minoff[ov] = np.maximum(before, (top + self.ov_mask[i]) & self.ov_keep[i])
        else:
            minoff[ov] = np.maximum(before, top)
        self.free[i] = False
        minoff[i] = self.cap  # placed: no floor (``offset`` is its lowest offset, restored)
        span = self.total[self.first_l[i] : self.last_l[i]]
        span -= nbytes  # in place through the view (``total[a:b] -= x`` would also copy back)
        self.offsets[i] = offset
        return before

    def unplace(self, i: int, offset: int, before: IntArray) -> None:
        """Undo :meth:`place`; ``offset`` is the buffer's lowest offset before it."""
        span = self.total[self.first_l[i] : self.last_l[i]]
        span += self.size_l[i]
        self.free[i] = True
        self.minoff[self.overlaps[i]] = before
        self.minoff[i] = offset

    def dynamic_decomposition(self, i: int) -> list[int]:
        """Lower the cuts inside buffer ``i``'s span; the section boundaries now cut to zero."""
        a, b = self.first_l[i], self.last_l[i]
        if b - a <= 1:
            return []
        inner = self.cuts[a : b - 1]
        inner -= 1
        zeros = (inner == 0).nonzero()[0]
        return (zeros + (a + 1)).tolist() if len(zeros) else []

    def undo_decomposition(self, i: int) -> None:
        """Undo :meth:`dynamic_decomposition`."""
        a, b = self.first_l[i], self.last_l[i]
        if b - a > 1:
            self.cuts[a : b - 1] += 1

    def split(self, part: BoolArray, lo: int, hi: int, cutpoints: list[int], tag: bytes) -> Step:
        """Solve the windows between new zero cuts one by one (they no longer interact)."""
        rest = part & self.free
        for w_lo, w_hi in pairwise([lo, *cutpoints, hi]):
            sub = rest & (self.first < w_hi) & (self.last > w_lo)
            if not sub.any():
                continue
            if self.fresh_windows:
                # minimalloc's sub-problems sort their buffers afresh: "T" now counts only
                # the bytes still unplaced, which reorders the window (often decisively).
                members = sub.nonzero()[0]
                section_max = np.maximum.reduceat(self.total_ext,
                                                  self.spans[members].ravel())[::2]
                order = self.sections.preorder(self.heuristic, members, section_max)
                window_rank = np.zeros(self.n, dtype=np.int64)
                window_rank[order] = np.arange(len(order), dtype=np.int64)
                # Ranks differ from window to window, and so does what a canonical bound means:
                # failed states are remembered per window (its buffers fix its ranks).
                window_tag = blake2b(members.tobytes(), digest_size=8).digest()
                status = yield self._node(sub, w_lo, w_hi, -1, window_rank, order.tolist(),
                                          window_tag)
            else:
                status = yield self._node(sub, w_lo, w_hi, -1, self.rank, self.by_rank, tag)
            if status is not FOUND:
                return status
        return FOUND

    # -----------------------------------------------------------------------------------------
    # Memory of failed states
    # -----------------------------------------------------------------------------------------

    def remembered_failure(self, state: bytes, last_key: int) -> bool:
        """The same state failed before under the same or a stricter canonical bound."""
        known = self.failed.get(state)
        if known is not None and known <= last_key:
            self.hits += 1
            return True
        return False

    def known_nogood(self, group: IntArray, low: IntArray) -> bool:
        """A true nogood of the same unplaced buffers has lowest offsets all at or below ours."""
        if (low >= group).all(axis=1).any():
            self.hits += 1
            return True
        return False

    def remember_failure(self, state: bytes, group_key: bytes, group: IntArray | None,
                         low: IntArray, last_key: int, clean: bool) -> None:
        """Store a failed state: as a true nogood when the canonical bound cut nothing (every
        unplaced buffer could still go at its lowest offset), else with its bound."""
        nogoods = self.nogoods
        if clean and self.use_nogoods:
            stored = self.stored
            if stored[0] + len(low) > NOGOOD_CELLS or len(nogoods) >= MEMORY_LIMIT:
                nogoods.clear()  # a bounded memory: forgetting only costs nodes
                stored[0] = 0
                group = None
            if group is None:
                nogoods[group_key] = low[None, :]
                stored[0] += len(low)
            elif len(group) < GROUP_LIMIT:
                nogoods[group_key] = np.vstack([group, low])
                stored[0] += len(low)
        elif self.remember:
            failed = self.failed
            if len(failed) >= MEMORY_LIMIT:
                failed.clear()  # a bounded memory: forgetting only costs nodes
            failed[state] = last_key
