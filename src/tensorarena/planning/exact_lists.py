"""The exact search's node on plain lists of ints, written for mypyc to compile.

The same search as :class:`~tensorarena.planning.exact_node.Search`, technique for technique and
node for node (the tests check that both visit the same number of nodes and find the same
offsets), for problems whose section table is small, pinned buffers included (the NumPy node's
rule, :mod:`~tensorarena.planning.exact_pins`). The NumPy node's cost on minimalloc's challenging
suite is nearly all the overhead of calling NumPy on arrays of a few hundred elements
(bench/RESULTS.md); here every loop is over ``list[int]`` and compiles, with the compiled build,
to C loops over native integers. Interpreted (the pure build), the same loops are
slower than NumPy, so :class:`~tensorarena.planning.exact_search.Solver` uses this module only
when it runs compiled (:func:`compiled`), unless asked otherwise.

What differs is form, not effect:

- the floor test (``unallocated_floor``) stops at the first section that fails and, inside a
  section, at the first member low enough to pass it (a section fails only when *every* unplaced
  member's lowest offset is above ``cap - unplaced bytes``), asking first the member that let the
  section pass last time (its witness);
- a child's window is its parent's unplaced buffers (the same set, without the placed buffers
  the child would only skip);
- the nodes run on an explicit stack of :class:`_Frame` records rather than generators: each frame
  holds its candidate keys and where it is in them, and a split (``dynamic_decomposition``) is a
  frame walking its windows;
- failed states are keyed by a 126-bit multiply-xorshift hash of their buffers and lowest offsets,
  computed in the node's one pass over its buffers (the NumPy node hashes the same numbers with
  BLAKE2b: packing a list into bytes costs more than this whole hash compiled). As with BLAKE2b,
  a collision would refute a state wrongly; over a search's few million keys its odds are below
  2^-80. A group of nogoods is one flat tuple of int rows, which the garbage collector stops
  tracking.

This module imports only the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, final

from tensorarena.planning.exact_pins import unblocked

if TYPE_CHECKING:  # native 64-bit integers for mypyc; plain ints interpreted
    from mypy_extensions import i64

__all__ = ["EXHAUSTED", "FOUND", "STOPPED", "ListSearch", "compiled"]

FOUND: Final = 0
EXHAUSTED: Final = 1
STOPPED: Final = 2
_ADVANCE: Final = 3  # not a status: "the frame on top goes on"
_NEVER: Final = 1 << 62
# Failed states are keyed by two 63-bit hashes of their buffers and lowest offsets: wrapping
# 64-bit arithmetic compiled, the same numbers interpreted (every product is masked).
_MASK: Final = 0x7FFFFFFFFFFFFFFF
_K1: Final = -7046029254386353131  # 0x9E3779B97F4A7C15, splitmix64's increment
_K2: Final = -4658895280553007687  # 0xBF58476D1CE4E5B9, splitmix64's first multiplier
_K3: Final = -7723592293110705685  # 0x94D049BB133111EB, its second
# Seeds of the four lanes (digits of pi): a lane must never start at a fixed point of its step.
_SEEDS: Final = (0x243F6A8885A308D3, 0x13198A2E03707344, 0x2A4093822299F31D, 0x082EFA98EC4E6C89)


def compiled() -> bool:
    """True when this module runs as mypyc's C extension, not as interpreted Python."""
    return not __file__.endswith(".py")


def _hash(values: list[int]) -> int:
    """A 63-bit multiply-xorshift hash of ``values`` (the same compiled and interpreted)."""
    mask: i64 = _MASK
    k1: i64 = _K1
    k3: i64 = _K3
    h: i64 = _SEEDS[0]
    for value in values:
        x: i64 = value + 1  # never 0: a lane at 0 would stay there
        h = ((h ^ x) * k1) & mask
        h = ((h ^ (h >> 29)) * k3) & mask
    return int(h ^ (h >> 32))


@final
class _Frame:
    """One node in progress: its window, its candidate keys and the placement being explored.

    ``part`` is the node's unplaced buffers: its children's window (one fewer each) without the
    buffers that the window held placed, which a child would only skip."""

    def __init__(self, part: list[int], lo: int, hi: int, last_key: int, rank: list[int],
                 by_rank: list[int], tag: int, keys: list[int], state: int,
                 group_key: int, group: tuple[int, ...] | None, low: list[int],
                 clean: bool) -> None:
        self.part = part
        self.lo = lo
        self.hi = hi
        self.last_key = last_key
        self.rank = rank
        self.by_rank = by_rank
        self.tag = tag
        self.keys = keys
        self.pos = 0
        self.state = state
        self.group_key = group_key
        self.group = group
        self.low = low
        self.clean = clean
        # The placement whose subtree is being searched.
        self.placed = -1
        self.prior = 0
        self.before: list[int] = []
        self.decomposed = False
        # A split in progress: window bounds, the next window, the unplaced buffers.
        self.splitting = False
        self.bounds: list[int] = []
        self.window = 0
        self.rest: list[int] = []


@final
class ListSearch:
    """One depth-first search under one static preorder and an optional node budget.

    The arguments are :class:`~tensorarena.planning.exact_node.Search`'s, unpacked into lists
    (``overlaps[i]``: the buffers live with ``i``; ``by_section`` and ``section_start``: the
    members of each section, section by section; ``limits``: the clock's spacing (nodes, and
    buffers x nodes), the most nogoods per group, failed states, and lowest offsets in nogoods).
    ``run`` returns ``FOUND``, ``EXHAUSTED`` or ``STOPPED``; ``offsets`` holds the plan after
    ``FOUND``.
    """

    def __init__(
        self,
        switches: tuple[bool, bool, bool, bool, bool, bool, bool, bool],
        capacity: int,
        size: list[int],
        align: list[int],
        first: list[int],
        last: list[int],
        width: list[int],
        overlaps: list[list[int]],
        total: list[int],
        cuts: list[int],
        by_section: list[int],
        section_start: list[int],
        rank: list[int],
        heuristic: str,
        deadline: float,
        failed: dict[int, int],
        nogoods: dict[int, tuple[int, ...]],
        stored: list[int],
        tick: Callable[[int], None] | None,
        limits: tuple[int, int, int, int, int],
        pin: list[int],
    ) -> None:
        (self.canonical, inference, dominance, self.floors, self.decompose, self.fresh_windows,
         self.remember, self.use_nogoods) = switches
        self.inference = inference and self.canonical
        self.dominance = dominance and self.canonical
        self.pin = pin  # each buffer's pinned offset, -1 for a free one
        self.pinned = any(p >= 0 for p in pin)
        if self.pinned:  # these assume every buffer can go at its lowest offset
            self.dominance = self.decompose = self.use_nogoods = False
        n = len(size)
        self.n = n
        self.cap = capacity
        self.size = size
        self.mask = [a - 1 for a in align]
        self.aligned = any(a > 1 for a in align)
        self.first = first
        self.last = last
        self.width = width
        self.overlaps = overlaps
        # Unplaced bytes per section, with a spare section at the end (as the NumPy node's).
        self.total = [*total, 0]
        self.cuts = cuts
        self.by_section = by_section
        self.section_start = section_start
        last_member = max(len(by_section) - 1, 0)
        self.witness = [min(k, last_member) for k in section_start[:-1]]
        self.rank = rank
        by_rank = [0] * n
        for i in range(n):
            by_rank[rank[i]] = i
        self.by_rank = by_rank
        self.heuristic = heuristic
        self.minoff = [0] * n
        self.free = [True] * n
        self.offsets = [0] * n
        self.deadline = deadline
        self.failed = failed
        self.nogoods = nogoods
        self.stored = stored
        self.tick = tick
        clock_every, clock_work, self.group_limit, self.memory_limit, self.nogood_cells = limits
        self.clock_every = max(1, min(clock_every, clock_work // max(n, 1)))
        self.hits = 0
        self.nodes = 0
        self.node_limit = _NEVER
        self.hard_limit = _NEVER
        self.timed_out = False

    def run(self, part: list[int], lo: int, hi: int, node_limit: int, hard_limit: int) -> int:
        """Solve the time window ``[lo, hi)`` (the buffers ``part``, ascending) within
        ``node_limit`` nodes (checked with the clock) and ``hard_limit`` (checked every node);
        a negative limit is none."""
        self.nodes = 0
        self.node_limit = node_limit if node_limit >= 0 else _NEVER
        self.hard_limit = hard_limit if hard_limit >= 0 else _NEVER
        self.timed_out = False
        stack: list[_Frame] = []
        reply = self._open(stack, part, lo, hi, -1, self.rank, self.by_rank, 0)
        if not stack:
            return reply
        reply = _ADVANCE
        while stack:
            frame = stack[-1]
            if reply == _ADVANCE:
                reply = self._advance(stack, frame)
            elif frame.splitting and reply == FOUND:
                reply = _ADVANCE  # the window fits: on to the next one
            else:
                frame.splitting = False
                reply = self._child_done(stack, frame, reply)
        return reply

    # -----------------------------------------------------------------------------------------
    # The node
    # -----------------------------------------------------------------------------------------

    def _open(self, stack: list[_Frame], part: list[int], lo: int, hi: int, last_key: int,
              rank: list[int], by_rank: list[int], tag: int) -> int:
        """Enter a node: a status when it ends at once, else its frame is pushed (_ADVANCE)."""
        if self._out_of_budget():
            return STOPPED
        if self.floors and self._floor_fails(lo, hi):
            return EXHAUSTED
        size = self.size
        cap = self.cap
        n = self.n
        # Section inference: offsets from cap - (the window's largest unplaced total) + 1 on
        # leave some section no room.
        limit = _NEVER
        if self.inference:
            total = self.total
            peak = 0
            for s in range(lo, hi):
                if total[s] > peak:
                    peak = total[s]
            limit = cap - peak + 1
        # One pass over the window's buffers: the unplaced ones, their lowest offsets, their
        # candidate keys, the lowest top any of them reaches (dominance), and two 63-bit hash
        # lanes each of the unplaced set (the nogoods' group) and of the state (set, offsets,
        # window tag).
        free = self.free
        minoff = self.minoff
        canonical = self.canonical
        fits = not self.inference
        idx: list[int] = []
        low: list[int] = []
        keys: list[int] = []
        smallest = _NEVER
        lowest_top = _NEVER
        pinned = self.pinned
        pin = self.pin
        pins: list[int] = []  # the unplaced pinned buffers
        pin_bar = _NEVER  # the lowest key among them
        # The constants as native locals (mypyc boxes a module constant this large).
        mask: i64 = _MASK
        k1: i64 = _K1
        k2: i64 = _K2
        k3: i64 = _K3
        g1: i64 = _SEEDS[0]
        g2: i64 = _SEEDS[1]
        s1: i64 = _SEEDS[2] ^ tag
        s2: i64 = _SEEDS[3] ^ tag
        # The copies into idx and low move the int objects themselves (lists of Any): an int
        # unboxed and boxed again would be a new object, an allocation per buffer per node.
        items: list[Any] = part
        offsets: list[Any] = minoff
        kept: list[Any] = idx
        lows: list[Any] = low
        for item in items:
            i: int = item
            if not free[i]:
                continue
            value = offsets[i]
            v: int = value
            if pinned and pin[i] >= 0:
                # Tried at its pin only; dead once something placed overlaps it or the
                # canonical order has passed it.
                value = pin[i]
                if v > value:
                    return EXHAUSTED
                v = value
                pin_key = v * n + rank[i]
                if canonical and pin_key <= last_key:
                    return EXHAUSTED
                pins.append(i)
                if pin_key < pin_bar:
                    pin_bar = pin_key
            kept.append(item)
            lows.append(value)
            nbytes = size[i]
            if v + nbytes < lowest_top:
                lowest_top = v + nbytes
            key = v * n + rank[i]
            if key < smallest:
                smallest = key
            if v < limit and not (canonical and key <= last_key) and not (
                    fits and v + nbytes > cap):
                keys.append(key)
            x: i64 = i + 1  # never 0: see _hash
            y: i64 = v + 1
            g1 = ((g1 ^ x) * k1) & mask
            g1 = ((g1 ^ (g1 >> 29)) * k3) & mask
            g2 = ((g2 ^ x) * k2) & mask
            g2 = ((g2 ^ (g2 >> 29)) * k3) & mask
            s1 = ((s1 ^ x) * k1) & mask
            s1 = ((s1 ^ (s1 >> 29) ^ y) * k3) & mask
            s2 = ((s2 ^ x) * k2) & mask
            s2 = ((s2 ^ (s2 >> 29) ^ y) * k3) & mask
        if not idx:
            return FOUND
        group_key = (int(g1 ^ (g1 >> 32)) << 63) | int(g2 ^ (g2 >> 32))
        state = (int(s1 ^ (s1 >> 32)) << 63) | int(s2 ^ (s2 >> 32))
        group: tuple[int, ...] | None = None
        if self.remember:
            known = self.failed.get(state)
            if known is not None and known <= last_key:
                self.hits += 1
                return EXHAUSTED
        if self.use_nogoods:
            group = self.nogoods.get(group_key)
            if group is not None and _dominated(group, low):
                self.hits += 1
                return EXHAUSTED
        keys.sort()
        if pins:
            keys = unblocked(keys, n, by_rank, pins, pin, size, self.first, self.last,
                             pin_bar if canonical else -1)
        if self.dominance:
            # Keys are offset * n + rank (rank < n): offset < lowest_top is key < lowest_top * n.
            bar = lowest_top * n
            cut = len(keys)
            while cut > 0 and keys[cut - 1] >= bar:
                cut -= 1
            if cut < len(keys):
                del keys[cut:]
        clean = smallest > last_key if canonical else True
        stack.append(_Frame(idx, lo, hi, last_key, rank, by_rank, tag, keys, state, group_key,
                            group, low, clean))
        return _ADVANCE

    def _advance(self, stack: list[_Frame], frame: _Frame) -> int:
        """Open the frame's next child: _ADVANCE when one was pushed or the frame goes on, else
        the frame's own status (it is then popped)."""
        if frame.splitting:
            return self._next_window(stack, frame)
        keys = frame.keys
        n = self.n
        while frame.pos < len(keys):
            key = keys[frame.pos]
            frame.pos += 1
            offset = key // n
            i = frame.by_rank[key - offset * n]
            frame.placed = i
            frame.prior = self.minoff[i]
            frame.before = self._place(i, offset)
            frame.decomposed = self.decompose
            if self.decompose:
                zeros = self._decompose(i)
                if zeros:
                    frame.splitting = True
                    frame.bounds = [frame.lo, *zeros, frame.hi]
                    frame.window = 0
                    free = self.free
                    frame.rest = [j for j in frame.part if free[j]]
                    return self._next_window(stack, frame)
            reply = self._open(stack, frame.part, frame.lo, frame.hi,
                               key if self.canonical else -1, frame.rank, frame.by_rank,
                               frame.tag)
            if reply == _ADVANCE:
                return _ADVANCE
            reply = self._child_done(stack, frame, reply)
            if reply != _ADVANCE:
                return reply
        self._remember_failure(frame)
        stack.pop()
        return EXHAUSTED

    def _child_done(self, stack: list[_Frame], frame: _Frame, status: int) -> int:
        """Undo the frame's placement; its status if the child's ends it, else _ADVANCE."""
        i = frame.placed
        if frame.decomposed:
            self._undo_decompose(i)
        self._unplace(i, frame.prior, frame.before)
        if status != EXHAUSTED:
            stack.pop()
            return status
        return _ADVANCE

    def _next_window(self, stack: list[_Frame], frame: _Frame) -> int:
        """Open the split's next window that holds unplaced buffers; FOUND when none is left."""
        bounds = frame.bounds
        first = self.first
        last = self.last
        while frame.window < len(bounds) - 1:
            w_lo = bounds[frame.window]
            w_hi = bounds[frame.window + 1]
            frame.window += 1
            sub = [j for j in frame.rest if first[j] < w_hi and last[j] > w_lo]
            if not sub:
                continue
            if self.fresh_windows:
                order = self._window_order(sub)
                window_rank = [0] * self.n
                for k in range(len(order)):
                    window_rank[order[k]] = k
                window_tag = _hash(sub)
                reply = self._open(stack, sub, w_lo, w_hi, -1, window_rank, order, window_tag)
            else:
                reply = self._open(stack, sub, w_lo, w_hi, -1, self.rank, self.by_rank,
                                   frame.tag)
            if reply == _ADVANCE:
                return _ADVANCE
            if reply != FOUND:
                frame.splitting = False
                return self._child_done(stack, frame, reply)
        frame.splitting = False
        return self._child_done(stack, frame, FOUND)

    def _out_of_budget(self) -> bool:
        """Count this node; True when the caller's budget, the clock or the round ran out."""
        if self.nodes >= self.hard_limit:
            return True
        self.nodes += 1
        if self.nodes % self.clock_every == 0:
            if time.monotonic() > self.deadline:
                self.timed_out = True
                return True
            tick = self.tick
            if tick is not None:
                tick(self.nodes)
            if self.nodes > self.node_limit:
                return True
        return False

    def _floor_fails(self, lo: int, hi: int) -> bool:
        """Some section's unplaced bytes cannot fit above the lowest offset its members reach
        (placed members hold ``cap``: no constraint).

        A section passes as soon as one member is low enough; the member that let it pass last
        time (its *witness*) is asked first, and usually still is: one look per section."""
        total = self.total
        start = self.section_start
        members = self.by_section
        witness = self.witness
        minoff = self.minoff
        cap = self.cap
        for s in range(lo, hi):
            unplaced = total[s]
            if unplaced <= 0:
                continue
            bar = cap - unplaced
            if minoff[members[witness[s]]] <= bar:
                continue
            k = start[s]
            end = start[s + 1]
            while k < end:
                if minoff[members[k]] <= bar:
                    break
                k += 1
            if k == end:
                return True
            witness[s] = k
        return False

    # -----------------------------------------------------------------------------------------
    # Placement, decomposition, window preorders
    # -----------------------------------------------------------------------------------------

    def _place(self, i: int, offset: int) -> list[int]:
        """Put buffer ``i`` at ``offset``; return its neighbours' lowest offsets before."""
        nbytes = self.size[i]
        top = offset + nbytes
        minoff = self.minoff
        ov = self.overlaps[i]
        objects: list[Any] = minoff  # copied and stored as objects: no int boxed again
        before: list[Any] = [objects[j] for j in ov]
        if self.aligned:
            mask = self.mask
            for j in ov:
                m = mask[j]
                raised = (top + m) & ~m
                if raised > minoff[j]:
                    minoff[j] = raised
        else:
            boxed: Any = top  # one object for every neighbour it raises
            for j in ov:
                if top > minoff[j]:
                    objects[j] = boxed
        self.free[i] = False
        minoff[i] = self.cap
        total = self.total
        for s in range(self.first[i], self.last[i]):
            total[s] -= nbytes
        self.offsets[i] = offset
        return before

    def _unplace(self, i: int, prior: int, before: list[int]) -> None:
        """Undo :meth:`_place`; ``prior`` is the buffer's lowest offset before it."""
        nbytes = self.size[i]
        total = self.total
        for s in range(self.first[i], self.last[i]):
            total[s] += nbytes
        self.free[i] = True
        objects: list[Any] = self.minoff
        saved: list[Any] = before
        ov = self.overlaps[i]
        for k in range(len(ov)):
            objects[ov[k]] = saved[k]
        self.minoff[i] = prior

    def _decompose(self, i: int) -> list[int]:
        """Lower the cuts inside buffer ``i``'s span; the boundaries that now cut to zero."""
        a = self.first[i]
        b = self.last[i]
        zeros: list[int] = []
        cuts = self.cuts
        for k in range(a, b - 1):
            cuts[k] -= 1
            if cuts[k] == 0:
                zeros.append(k + 1)
        return zeros

    def _undo_decompose(self, i: int) -> None:
        cuts = self.cuts
        for k in range(self.first[i], self.last[i] - 1):
            cuts[k] += 1

    def _window_order(self, members: list[int]) -> list[int]:
        """``members`` sorted by the preorder afresh, "T" counting only the unplaced bytes:
        larger first on each letter, index breaks ties (``Sections.preorder``)."""
        total = self.total
        size = self.size
        width = self.width
        first = self.first
        last = self.last
        rows: list[tuple[list[int], int]] = []
        for m in members:
            peak = total[first[m]]
            for s in range(first[m] + 1, last[m]):
                if total[s] > peak:
                    peak = total[s]
            row: list[int] = []
            for letter in self.heuristic:
                if letter == "W":
                    row.append(-width[m])
                elif letter == "A":
                    row.append(-width[m] * size[m])
                elif letter == "T":
                    row.append(-peak)
                elif letter == "Z":
                    row.append(-size[m])
                else:
                    row.append(first[m] - last[m])
            row.append(m)
            rows.append((row, m))
        rows.sort()
        return [m for _, m in rows]

    # -----------------------------------------------------------------------------------------
    # Memory of failed states
    # -----------------------------------------------------------------------------------------

    def _remember_failure(self, frame: _Frame) -> None:
        """Store a failed state: a true nogood when the canonical bound cut nothing, else with
        its bound (``Search.remember_failure``)."""
        low = frame.low
        if frame.clean and self.use_nogoods:
            nogoods = self.nogoods
            stored = self.stored
            group = frame.group
            if stored[0] + len(low) > self.nogood_cells or len(nogoods) >= self.memory_limit:
                nogoods.clear()  # a bounded memory: forgetting only costs nodes
                stored[0] = 0
                group = None
            if group is None:
                nogoods[frame.group_key] = tuple(low)
                stored[0] += len(low)
            elif len(group) < self.group_limit * len(low):
                nogoods[frame.group_key] = group + tuple(low)
                stored[0] += len(low)
        elif self.remember:
            failed = self.failed
            if len(failed) >= self.memory_limit:
                failed.clear()
            failed[frame.state] = frame.last_key


def _dominated(group: tuple[int, ...], low: list[int]) -> bool:
    """Some nogood of the group (its rows one after another, flat) has every lowest offset at
    or below ours."""
    count = len(low)
    row = 0
    while row < len(group):
        k = 0
        while k < count:
            if low[k] < group[row + k]:
                break
            k += 1
        if k == count:
            return True
        row += count
    return False
