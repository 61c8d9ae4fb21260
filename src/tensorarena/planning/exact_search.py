"""The decision search of the exact planner: does every buffer fit below a capacity?

A depth-first branch and bound over *canonical* placements, after minimalloc (M. D. Moffitt,
ASPLOS 2023). Any plan can be pushed down until no buffer can move lower; listed by offset, every
buffer of such a compact plan then sits at its *lowest offset*: the aligned top of the highest
buffer already placed that shares time with it (0 if none). So the search only ever chooses *which*
buffer comes next, never where, and it may insist that placements come in non-decreasing
(offset, preorder rank) order, which enumerates each compact plan once. Pruning, all sound for
compact plans:

- *dominance*: a buffer may not go at or above the lowest top any unplaced buffer could reach,
  since that buffer would then fit entirely in the space below and the plan would not be compact;
- *section inference*: once a buffer sits at ``offset``, every later one sits at ``offset`` or
  higher, so in every section the unplaced live bytes must fit between ``offset`` (or the top of
  the newest buffer there) and the capacity; a candidate's sections and the rest of the window
  make up the whole window, so one maximum of the window checks every candidate at once;
- *unallocated floors*: nothing unplaced in a section can go below the lowest offset any of its
  unplaced buffers can reach, so the section's unplaced bytes must fit above that floor;
- *dynamic decomposition*: when the last unplaced buffer spanning a section boundary is placed,
  the two sides no longer interact and are solved one after the other, so a failure on one side
  does not make the search re-enumerate the other. As in minimalloc, each window split off this
  way sorts its buffers afresh, with "T" counting only the bytes still unplaced (this alone
  takes minimalloc's challenging H and I from over 30 s to under 1 s); the windows that exist
  from the start each get a round robin of their own;
- *memory of failed states* (ours, not minimalloc's): a state is the set of unplaced buffers and
  their lowest offsets; different orders of placing the same buffers often leave the same one.
  A failed state is remembered with its canonical bound; when that bound restricted nothing, the
  failure is a true nogood, which also condemns any state with the same unplaced buffers and
  lowest offsets at least as high, whatever the preorder.

The sorted listing of every fully compact plan survives every cut above, which is all that
completeness needs. State lives in preallocated NumPy arrays (lowest offsets, unplaced mask,
unplaced bytes per section, cuts) updated in place and undone on backtrack; a node allocates only
small index arrays. The inner loop is NumPy calls on arrays of a few hundred elements, so a node
costs tens of microseconds: minimalloc's C++ visits nodes one to two orders of magnitude faster.

The search is depth-first and as deep as the buffers it places, so it does not recurse on the
interpreter's stack (which would need ``sys.setrecursionlimit``, a process-wide setting that every
thread shares). Each node is a generator that *yields* the call it would have made and is sent
the child's answer; :func:`_drive` keeps the suspended nodes on a list. That costs a generator
and a ``StopIteration`` per node, a few percent of a node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from hashlib import blake2b
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from tensorarena.planning.exact_sections import PREORDERS, Sections

__all__ = ["EXHAUSTED", "FOUND", "STOPPED", "Decision", "decide"]

FOUND, EXHAUSTED, STOPPED = "found", "exhausted", "stopped"

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: One node of the search: yields the nodes it would have called, is sent their status, and
#: returns its own (see :func:`_drive`).
Step = Generator["Step", str, str]

# How many nodes pass between two looks at the clock: a clock read costs about as much as a node
# of a small problem. A node costs time linear in the problem, so large ones look more often.
_CLOCK_EVERY = 256
_CLOCK_WORK = 60_000  # buffers x nodes between two looks at the clock, at most
# Most nogoods kept per set of unplaced buffers (each check scans them all).
_GROUP_LIMIT = 64
# Most failed states remembered (about 150 bytes each) before the memory starts afresh.
_MEMORY_LIMIT = 1_000_000
# Most lowest offsets kept in nogoods (8 bytes each: a row per nogood, a column per unplaced
# buffer), so that large problems cannot fill the memory with them.
_NOGOOD_CELLS = 16_000_000
# Largest section → members table (sum of every buffer's section count) built for the floors.
_MEMBERS_LIMIT = 4_000_000


class Decision:
    """Outcome of one decision search: ``status`` is FOUND, EXHAUSTED (no plan) or STOPPED."""

    __slots__ = ("nodes", "offsets", "status")

    def __init__(self, status: str, offsets: IntArray | None, nodes: int) -> None:
        self.status = status
        self.offsets = offsets  #: one offset per searched buffer when FOUND
        self.nodes = nodes


def decide(
    sections: Sections,
    capacity: int,
    *,
    deadline: float,
    preorders: tuple[str, ...] = PREORDERS,
    decompose: bool = True,
    remember: bool = True,
    node_limit: int | None = None,
    on_tick: Callable[[int], None] | None = None,
) -> Decision:
    """Search for offsets that fit every buffer in ``sections`` below ``capacity``.

    Several static preorders are tried round robin with a node budget that doubles each round
    (minimalloc's schedule), so one unlucky order does not sink the search; each independent
    time window (between zero cuts) has a schedule of its own. Stops at ``deadline``
    (a ``time.monotonic()`` value) with STOPPED, and after ``node_limit`` nodes in all (a budget
    that, unlike the clock, stops at the same place on any machine). ``decompose=False`` turns
    off the splitting into independent time windows and ``remember=False`` the memory of failed
    states (for tests that check that neither changes an answer). ``on_tick`` is called with the
    nodes visited so far at every look at the clock (a progress report's heartbeat).
    """
    n = len(sections)
    if n == 0:
        return Decision(FOUND, np.zeros(0, dtype=np.int64), 0)
    if int(sections.total.max()) > capacity:
        return Decision(EXHAUSTED, None, 0)
    ranks = [sections.preorder_rank(h) for h in preorders]
    # Failed states stay failed across the restarts of one preorder (same capacity, same rank).
    caches: list[dict[bytes, int]] = [{} for _ in ranks]
    # True nogoods (see _Search) hold whatever the order: all preorders share them.
    nogoods: dict[bytes, IntArray] = {}
    stored = [0]  # lowest offsets held in ``nogoods``, against _NOGOOD_CELLS
    searches: list[_Search | None] = [None] * len(ranks)  # built when first needed
    spent = [0]  # nodes of the runs already finished, for on_tick
    tick = None if on_tick is None else (lambda k: on_tick(spent[0] + k))

    def search(k: int) -> _Search:
        built = searches[k]
        if built is None:
            built = searches[k] = _Search(
                sections,
                capacity,
                ranks[k],
                preorders[k],
                deadline,
                decompose,
                remember,
                caches[k],
                nogoods,
                stored,
                tick,
            )
        return built

    # Windows between zero cuts share no buffer: each gets its own round robin, so a window
    # solved once stays solved while another needs more restarts (one schedule over all of
    # them would solve the easy ones again at every restart, and only under the same order).
    cutpoints = (np.flatnonzero(sections.cuts == 0) + 1).tolist() if decompose else []
    bounds = [0, *cutpoints, sections.n_sections]
    offsets = np.zeros(n, dtype=np.int64)
    nodes = 0
    for lo, hi in pairwise(bounds):
        inside = (sections.first < hi) & (sections.last > lo)
        count = int(inside.sum())
        if not count:
            continue
        if time.monotonic() > deadline:  # many small windows may never reach a clock check
            return Decision(STOPPED, None, nodes)
        budget = count
        solved = None
        while solved is None:
            budget *= 2
            for k in range(len(ranks)):
                limit = budget if len(ranks) > 1 else None
                left = None if node_limit is None else node_limit - nodes
                if left is not None and left <= 0:
                    return Decision(STOPPED, None, nodes)
                current = search(k)
                status = current.run(inside, lo, hi, limit, left)
                nodes += current.nodes
                spent[0] = nodes
                if status == FOUND:
                    solved = current
                    break
                if status == EXHAUSTED:
                    return Decision(EXHAUSTED, None, nodes)
                if current.timed_out:
                    return Decision(STOPPED, None, nodes)
        offsets[inside] = solved.offsets[inside]
    return Decision(FOUND, offsets, nodes)


def _drive(root: Step) -> str:
    """Run the node ``root`` and every node it yields, depth first, on a list, not the C stack.

    A node yields a child node and is sent back the child's status when the child returns.
    """
    stack = [root]
    push, pop = stack.append, stack.pop
    node = root
    reply: str | None = None
    while True:
        try:
            child = node.send(reply)  # type: ignore[arg-type]  # None starts a fresh node
        except StopIteration as done:
            pop()
            if not stack:
                status: str = done.value
                return status
            node = stack[-1]
            reply = done.value
            continue
        push(child)
        node = child
        reply = None


class _Search:
    """One depth-first search under one static preorder and an optional node budget."""

    def __init__(
        self,
        sections: Sections,
        capacity: int,
        rank: IntArray,
        heuristic: str,
        deadline: float,
        decompose: bool,
        remember: bool,
        failed: dict[bytes, int],
        nogoods: dict[bytes, IntArray],
        stored: list[int],
        tick: Callable[[int], None] | None = None,
    ) -> None:
        self.sections = sections
        self.capacity = capacity
        self.rank = rank
        self.heuristic = heuristic
        self.deadline = deadline
        self.node_limit = 1 << 62
        self.hard_limit = 1 << 62
        self.decompose = decompose
        self.remember = remember
        self.failed = failed
        self.nogoods = nogoods
        self.stored = stored
        self.tick = tick
        self.hits = 0
        self.nodes = 0
        self.timed_out = False
        self.offsets = np.zeros(len(sections), dtype=np.int64)
        self._search = self._make_search()

    def run(
        self, part: BoolArray, lo: int, hi: int, node_limit: int | None, hard_limit: int | None
    ) -> str:
        """Solve the time window ``[lo, hi)`` (buffers ``part``) within ``node_limit`` nodes.

        ``node_limit`` is the round robin's budget, checked with the clock (a few hundred nodes
        more do no harm); ``hard_limit`` is the caller's, checked at every node.
        """
        self.nodes = 0
        self.node_limit = node_limit if node_limit is not None else 1 << 62
        self.hard_limit = hard_limit if hard_limit is not None else 1 << 62
        self.timed_out = False
        return _drive(self._search(part.copy(), lo, hi, -1, self.rank, self.by_rank, b""))

    def _make_search(
        self,
    ) -> Callable[[BoolArray, int, int, int, IntArray, list[int], bytes], Step]:
        """Build the search's node as closures over local arrays (the hot path)."""
        sec = self.sections
        n = len(sec)
        cap = self.capacity
        size = sec.size
        size_l: list[int] = size.tolist()
        first, last = sec.first, sec.last
        first_l: list[int] = first.tolist()
        last_l: list[int] = last.tolist()
        rank = self.rank
        by_rank: list[int] = np.argsort(rank).tolist()
        self.by_rank = by_rank
        overlaps = sec.overlaps
        aligned = bool((sec.align > 1).any())
        mask = sec.align - 1
        # Per-neighbour alignment masks, built only when some alignment is above 1.
        ov_mask = [mask[ov] for ov in overlaps] if aligned else []
        ov_keep = [~m for m in ov_mask]
        minoff = np.zeros(n, dtype=np.int64)
        free = np.ones(n, dtype=np.bool_)
        # Unplaced bytes per section, with one spare section at the end so that ``reduceat``
        # may start a range at a buffer's ``last``.
        total_ext = np.zeros(sec.n_sections + 1, dtype=np.int64)
        total_ext[:-1] = sec.total
        total = total_ext[:-1]
        spans = np.stack([first, last], axis=1)
        reduce_max = np.maximum.reduceat
        preorder = sec.preorder
        heuristic = self.heuristic
        minimum_reduceat = np.minimum.reduceat
        # Section → member buffers (placed or not), when that table stays small.
        lengths = last - first
        by_section: npt.NDArray[np.int32] | None = None
        section_start = np.zeros(sec.n_sections + 1, dtype=np.int64)
        if int(lengths.sum()) <= _MEMBERS_LIMIT:
            owner = np.repeat(np.arange(n, dtype=np.int32), lengths)
            where = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            where += np.repeat(first, lengths)
            by_section = owner[np.argsort(where, kind="stable")]
            np.cumsum(np.bincount(where, minlength=sec.n_sections), out=section_start[1:])
        cuts = sec.cuts.copy()
        sol = self.offsets
        deadline = self.deadline
        monotonic = time.monotonic
        maximum = np.maximum
        minimum = np.minimum
        minimum_at = np.minimum.at
        clock_every = max(1, min(_CLOCK_EVERY, _CLOCK_WORK // n))
        stored = self.stored
        decompose = self.decompose
        remember = self.remember
        failed = self.failed
        nogoods = self.nogoods
        tick = self.tick
        this = self

        def search(
            part: BoolArray,
            lo: int,
            hi: int,
            last_key: int,
            rank: IntArray,
            by_rank: list[int],
            tag: bytes,
        ) -> Step:
            if this.nodes >= this.hard_limit:
                return STOPPED
            this.nodes += 1
            if this.nodes % clock_every == 0:
                if monotonic() > deadline:
                    this.timed_out = True
                    return STOPPED
                if tick is not None:
                    tick(this.nodes)
                if this.nodes > this.node_limit:
                    return STOPPED
            # Unallocated floor: in every section, nothing unplaced can go below the lowest
            # offset any of its unplaced buffers can reach, so the live bytes must fit above it.
            # Checked first: about half of all nodes end here.
            window = total[lo:hi]
            if by_section is not None:
                # Members of every section, listed section by section: one gather and one
                # segmented minimum. Placed buffers hold ``cap`` or more (no constraint); the
                # clip keeps a section without unplaced bytes (or without members) harmless.
                a, b = section_start[lo], section_start[hi]
                floor = minimum_reduceat(minoff[by_section[a:b]], section_start[lo:hi] - a)
                minimum(floor, cap, out=floor)
                if int((floor + window).max()) > cap:
                    return EXHAUSTED
            idx = (part & free).nonzero()[0]
            if not len(idx):
                return FOUND
            low = minoff[idx]
            if by_section is None and int((scattered_floor(idx, low, lo, hi) + window).max()) > cap:
                return EXHAUSTED
            # Section inference: every later buffer sits at or above the next one's offset, so
            # in every section of the window the unplaced bytes must fit above it. A candidate's
            # own sections (it included) and the others together are the whole window: one
            # maximum serves every candidate.
            peak = int(window.max())
            # Different orders of placing the same buffers often leave the same skyline: the
            # same unplaced buffers with the same lowest offsets. Such a state that failed once
            # fails again under the same or a stricter canonical bound ``last_key``.
            state = blake2b(tag + idx.tobytes() + low.tobytes(), digest_size=16).digest()
            known = failed.get(state) if remember else None
            if known is not None and known <= last_key:
                this.hits += 1
                return EXHAUSTED
            group_key = blake2b(idx.tobytes(), digest_size=16).digest()
            group = nogoods.get(group_key) if remember else None
            if group is not None and (low >= group).all(axis=1).any():
                this.hits += 1
                return EXHAUSTED
            reach = int((low + size[idx]).min())
            keys = low * n + rank[idx]
            clean = int(keys.min()) > last_key
            keys = keys[(keys > last_key) & (low < min(reach, cap - peak + 1))]
            keys.sort()
            for key in keys.tolist():
                offset, r = divmod(key, n)
                i = by_rank[r]
                nbytes = size_l[i]
                top = offset + nbytes
                ov = overlaps[i]
                before = minoff[ov]
                if aligned:
                    minoff[ov] = maximum(before, (top + ov_mask[i]) & ov_keep[i])
                else:
                    minoff[ov] = maximum(before, top)
                free[i] = False
                minoff[i] = cap  # placed: no floor (``offset`` is its lowest offset, restored)
                a, b = first_l[i], last_l[i]
                span = total[a:b]
                span -= nbytes
                sol[i] = offset
                if b - a > 1 and decompose:
                    inner = cuts[a : b - 1]
                    inner -= 1
                    zeros = (inner == 0).nonzero()[0]
                    if len(zeros):
                        status = yield split(part, lo, hi, (zeros + (a + 1)).tolist())
                    else:
                        status = yield search(part, lo, hi, key, rank, by_rank, tag)
                    inner += 1
                else:
                    status = yield search(part, lo, hi, key, rank, by_rank, tag)
                span += nbytes
                free[i] = True
                minoff[ov] = before
                minoff[i] = offset
                if status != EXHAUSTED:
                    return status
            if clean:
                # Every unplaced buffer could still go at its lowest offset, so the canonical
                # bound cut nothing: no plan at all completes this state, nor any state with the
                # same unplaced buffers and lowest offsets at least as high.
                if stored[0] + len(low) > _NOGOOD_CELLS or len(nogoods) >= _MEMORY_LIMIT:
                    nogoods.clear()  # a bounded memory: forgetting only costs nodes
                    stored[0] = 0
                    group = None
                if group is None:
                    nogoods[group_key] = low[None, :]
                    stored[0] += len(low)
                elif len(group) < _GROUP_LIMIT:
                    nogoods[group_key] = np.vstack([group, low])
                    stored[0] += len(low)
            else:
                if len(failed) >= _MEMORY_LIMIT:
                    failed.clear()  # a bounded memory: forgetting only costs nodes
                failed[state] = last_key
            return EXHAUSTED

        def scattered_floor(idx: IntArray, low: IntArray, lo: int, hi: int) -> IntArray:
            """The floors by one scatter over every (section, unplaced buffer) pair.

            A function of its own so that its large temporaries die before the search goes
            deeper (each suspended node would otherwise keep them alive).
            """
            starts = first[idx]
            lengths = last[idx] - starts
            ends = np.cumsum(lengths)
            where = np.arange(int(ends[-1])) + np.repeat(starts - ends + lengths - lo, lengths)
            floor = np.full(hi - lo, cap, dtype=np.int64)
            minimum_at(floor, where, np.repeat(low, lengths))
            return floor

        def split(part: BoolArray, lo: int, hi: int, cutpoints: list[int]) -> Step:
            """Solve the windows between new zero cuts one by one (they no longer interact)."""
            rest = part & free
            bounds = [lo, *cutpoints, hi]
            for w_lo, w_hi in pairwise(bounds):
                sub = rest & (first < w_hi) & (last > w_lo)
                if not sub.any():
                    continue
                # minimalloc's sub-problems sort their buffers afresh: "T" now counts only
                # the bytes still unplaced, which reorders the window (often decisively).
                members = sub.nonzero()[0]
                section_max = reduce_max(total_ext, spans[members].ravel())[::2]
                order = preorder(heuristic, members, section_max)
                window_rank = np.zeros(n, dtype=np.int64)
                window_rank[order] = np.arange(len(order), dtype=np.int64)
                # Ranks differ from window to window, and so does what a canonical bound means:
                # failed states are remembered per window (its buffers fix its ranks).
                tag = blake2b(members.tobytes(), digest_size=8).digest()
                status = yield search(sub, w_lo, w_hi, -1, window_rank, order.tolist(), tag)
                if status != FOUND:
                    return status
            return FOUND

        return search
