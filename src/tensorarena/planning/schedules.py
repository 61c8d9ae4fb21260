"""Topological orders that keep memory low: Inductor's three heuristics, a local search, and an
exact search for small graphs.

PyTorch Inductor's ``reorder_for_peak_memory`` tries three topological sorts and keeps the one with
the lowest estimated peak; they are reimplemented here from their descriptions, as baselines:

- :func:`lpmf` (least peak memory first, after Kim et al., DAC 2006): among the nodes ready to
  run, one whose run keeps memory under the peak so far and leaves the least live after it;
  when none stays under, the one that raises the peak least;
- :func:`bfs`: first the ready node whose predecessors ran earliest (a FIFO order);
- :func:`dfs`: a depth-first sort that visits nodes, and their predecessors, in increasing order
  of the bytes each reads and writes.

:func:`improve` then goes past them: a local search that looks at the step where live bytes peak
and tries to *sink* a node whose outputs are live there to the latest step its successors allow,
or to *hoist* a node that frees bytes live there to the earliest step its predecessors allow,
keeping a move when it lowers (peak, number of steps at the peak). :func:`exact` searches every
topological order of a small graph, memoised on the set of nodes already run (the live bytes
depend on that set alone), and proves the lowest peak.

Every function takes an :class:`~tensorarena.planning.op_graph.OpGraph` and returns node indices.
The searches stop at a :class:`~tensorarena.planning.budget.StepBudget` (scoring an order or
making a move costs a step per node of the graph, a set of run nodes memoised one per node of
its window), which ends them at the same place on any machine, or at a deadline, the outer bound.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Sequence

import numpy as np

from tensorarena.planning.budget import StepBudget
from tensorarena.planning.op_graph import OpGraph

__all__ = ["bfs", "dfs", "exact", "exact_window", "improve", "lpmf"]


# ---------------------------------------------------------------------------------------------
# Inductor's heuristics
# ---------------------------------------------------------------------------------------------


def lpmf(graph: OpGraph) -> list[int]:
    """Least peak memory first: key (max(live + allocated, peak so far), allocated - freed)."""
    succ = graph.successors
    sizes = graph.sizes
    waiting = [len(p) for p in graph.preds]
    # Users not yet run of each buffer; when one is left, running it frees the buffer.
    left = [len(set(u)) for u in graph.users]
    frees = [0] * len(graph)
    for b, users in enumerate(graph.users):
        if b not in graph.outputs and left[b] == 1:
            frees[users[0]] += sizes[b]
    allocates = [sum(sizes[b] for b in made) for made in graph.produces]
    ready = [v for v, w in enumerate(waiting) if w == 0]
    run = [False] * len(graph)
    live = peak = 0
    order: list[int] = []
    while ready:
        v = min(ready, key=lambda u: (max(live + allocates[u], peak),
                                      allocates[u] - frees[u], u))
        ready.remove(v)
        order.append(v)
        run[v] = True
        live += allocates[v]
        peak = max(peak, live)
        live -= frees[v]
        for b in {*graph.uses[v], *graph.produces[v]}:
            left[b] -= 1
            if left[b] == 1 and b not in graph.outputs:
                last = next(u for u in graph.users[b] if not run[u])
                frees[last] += sizes[b]
        for s in succ[v]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    return order


def bfs(graph: OpGraph) -> list[int]:
    """The ready node whose predecessors ran earliest first (sorted predecessor positions)."""
    succ = graph.successors
    waiting = [len(p) for p in graph.preds]
    pos: dict[int, int] = {}
    heap: list[tuple[tuple[int, ...], int]] = [((), v) for v, w in enumerate(waiting) if w == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, v = heapq.heappop(heap)
        pos[v] = len(order)
        order.append(v)
        for s in succ[v]:
            waiting[s] -= 1
            if waiting[s] == 0:
                key = tuple(sorted(pos[p] for p in graph.preds[s]))
                heapq.heappush(heap, (key, s))
    return order


def dfs(graph: OpGraph) -> list[int]:
    """Depth first, visiting nodes (and predecessors) by increasing bytes read and written."""
    sizes = graph.sizes
    weight = [sum(sizes[b] for b in {*graph.uses[v], *graph.produces[v]})
              for v in range(len(graph))]
    visited = [False] * len(graph)
    order: list[int] = []
    for root in sorted(range(len(graph)), key=lambda v: (weight[v], v)):
        if visited[root]:
            continue
        # An explicit stack: graphs are deeper than the interpreter's recursion limit.
        stack = [(root, iter(sorted(graph.preds[root], key=lambda p: (weight[p], p))))]
        visited[root] = True
        while stack:
            node, preds = stack[-1]
            for p in preds:
                if not visited[p]:
                    visited[p] = True
                    stack.append((p, iter(sorted(graph.preds[p], key=lambda q: (weight[q], q)))))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


# ---------------------------------------------------------------------------------------------
# Past them: local search
# ---------------------------------------------------------------------------------------------


def _score(graph: OpGraph, order: Sequence[int]) -> tuple[int, int, int]:
    """(peak, steps at the peak, bytes x steps): a move must lower this, so the search ends."""
    profile = graph.profile(order)
    if not len(profile):
        return 0, 0, 0
    peak = int(profile.max())
    return peak, int((profile == peak).sum()), int(profile.sum())


def improve(graph: OpGraph, order: Sequence[int], *, deadline: float,
            seed: int = 0, target: int = 0, patience: int = 200,
            steps: StepBudget | None = None) -> list[int]:
    """Lower the peak of ``order`` by moving a node (with what must move along) at a time.

    A descent: the first move that lowers the score is kept, and when no single move does, the
    window around the peak is reordered exactly. When that fails too, an iterated local search:
    a few random moves around the high steps shake the order, the descent runs again, and the
    best order seen is kept, until ``steps`` or the deadline run out, until ``patience`` kicks
    in a row found nothing better, or until the peak is down to ``target`` (a lower bound:
    nothing can do better).
    """
    steps = StepBudget(None) if steps is None else steps
    rng = random.Random(seed)
    succ = graph.successors
    current = list(order)
    score = _score(graph, current)
    best, best_score = current, score
    stale = 0
    while (time.monotonic() < deadline and not steps.exhausted and best_score[0] > target
           and stale <= patience):
        current, score = _descend(graph, succ, current, score, rng, deadline, steps)
        if score < best_score:
            best, best_score, stale = current, score, 0
        else:
            stale += 1
        if time.monotonic() >= deadline or len(graph) < 3 or not steps.spend(len(graph)):
            break
        current = best
        for _ in range(rng.randint(1, 4)):  # a kick from the best order so far
            moves = _moves(graph, succ, current, rng, high=True)
            if moves:
                current = rng.choice(moves)
        score = _score(graph, current)
    return best


def _descend(graph: OpGraph, succ: Sequence[Sequence[int]], current: list[int],
             score: tuple[int, int, int], rng: random.Random, deadline: float,
             steps: StepBudget) -> tuple[list[int], tuple[int, int, int]]:
    while time.monotonic() < deadline and not steps.exhausted:
        moved = False
        for candidate in _moves(graph, succ, current, rng):
            if time.monotonic() >= deadline or not steps.spend(len(graph)):
                break
            new = _score(graph, candidate)
            if new < score:
                current, score, moved = candidate, new, True
                break
        if not moved:
            # No single move helps: reorder the window around the peak exactly.
            window = _window(graph, current, deadline, steps)
            if window is None:
                break
            new = _score(graph, window)
            if new >= score:
                break
            current, score = window, new
    return current, score


#: Nodes reordered exactly around the peak when single moves are exhausted.
WINDOW = 14


def _window(graph: OpGraph, order: list[int], deadline: float,
            steps: StepBudget) -> list[int] | None:
    """``order`` with the nodes around its first peak step in their best order, or None."""
    profile = graph.profile(order)
    if not len(profile):
        return None
    t = int(profile.argmax())
    lo = max(0, min(t - WINDOW // 2, len(order) - WINDOW))
    hi = min(len(order), lo + WINDOW)
    inner = exact_window(graph, order, lo, hi, deadline=deadline, steps=steps)
    if inner is None:
        return None
    return order[:lo] + inner + order[hi:]


def exact_window(graph: OpGraph, order: Sequence[int], lo: int, hi: int, *,
                 max_states: int = 100_000, deadline: float = float("inf"),
                 steps: StepBudget | None = None) -> list[int] | None:
    """The nodes ``order[lo:hi]`` in the order that gives them the lowest peak (None if the
    search would pass ``max_states``, the ``steps`` left (one per state) or the deadline).

    Nodes before ``lo`` have run, those from ``hi`` on run later, so every buffer starts and
    ends where it did outside the window and only the steps inside it change: the window's
    lowest peak is a minimax over the sets of its nodes run so far (the live bytes depend on
    that set alone), memoised.
    """
    members = list(order[lo:hi])
    k = len(members)
    local = {v: i for i, v in enumerate(members)}
    earlier = set(order[:lo])
    sizes = graph.sizes
    pred_mask = [sum(1 << local[p] for p in graph.preds[v] if p in local) for v in members]
    # The buffers the window touches: who makes them, who uses them inside, who after.
    touched = sorted({b for v in members for b in (*graph.uses[v], *graph.produces[v])})
    made_at = {b: local.get(int(graph.producer[b]), -1) for b in touched}
    inside = {b: sum(1 << local[u] for u in set(graph.users[b]) if u in local) for b in touched}
    kept = {b: b in graph.outputs or any(u not in local and u not in earlier
                                         for u in graph.users[b]) for b in touched}
    allocates = [sum(sizes[b] for b in graph.produces[v]) for v in members]
    by_node = [[b for b in touched if inside[b] >> i & 1] for i in range(k)]
    full = (1 << k) - 1
    start_live = sum(sizes[b] for b in touched
                     if made_at[b] < 0 and (kept[b] or inside[b]))
    memo: dict[int, tuple[int, int]] = {}
    if steps is not None:
        left = steps.left()
        max_states = max_states if left is None else min(max_states, left // max(1, k))

    def freed(done: int, i: int) -> int:
        after = done | 1 << i
        return sum(sizes[b] for b in by_node[i]
                   if not kept[b] and inside[b] & ~after == 0)

    def solve(done: int, live: int) -> int:
        if done == full:
            return 0
        known = memo.get(done)
        if known is not None:
            return known[0]
        if len(memo) >= max_states or time.monotonic() > deadline:
            raise _TooLarge
        best, choice = -1, -1
        for i in range(k):
            if not done >> i & 1 and pred_mask[i] & ~done == 0:
                during = live + allocates[i]
                if best >= 0 and during >= best:
                    continue
                value = max(during, solve(done | 1 << i, during - freed(done, i)))
                if best < 0 or value < best:
                    best, choice = value, i
        memo[done] = (best, choice)
        return best

    try:
        solve(0, start_live)
    except _TooLarge:
        return None
    finally:
        if steps is not None:
            steps.spend(len(memo) * k)
    result, done = [], 0
    while done != full:
        i = memo[done][1]
        result.append(members[i])
        done |= 1 << i
    return result


def _closure(start: int, links: Sequence[Sequence[int]], keep: np.ndarray) -> list[int]:
    """``start`` and every node reachable through ``links`` among those ``keep`` allows."""
    found = {start}
    stack = [start]
    while stack:
        for w in links[stack.pop()]:
            if keep[w] and w not in found:
                found.add(w)
                stack.append(w)
    return list(found)


def _moves(graph: OpGraph, succ: Sequence[Sequence[int]], order: list[int],
           rng: random.Random, *, high: bool = False) -> list[list[int]]:
    """Orders one move away that might lower the first peak step ``t``.

    A *sink* takes a node whose outputs are live at ``t`` (and the nodes up to ``t`` that
    depend on it) past ``t``; a *hoist* takes a node that frees bytes live at ``t`` (and the
    nodes after ``t`` it depends on) before ``t``. Both keep every dependency by construction.
    """
    n = len(order)
    pos = np.empty(n, np.int64)
    pos[np.asarray(order, np.int64)] = np.arange(n, dtype=np.int64)
    start, end = graph.lifetimes(order)
    profile = graph.profile(order)
    if not len(profile):
        return []
    if high:  # any step within 2 % of the peak: where a kick may open a way down
        steps = np.flatnonzero(profile >= profile.max() * 0.98)
        t = int(steps[rng.randrange(len(steps))])
    else:
        t = int(profile.argmax())
    live = np.flatnonzero((start <= t) & (end > t))
    before = pos <= t
    moves: list[list[int]] = []
    seen: set[tuple[str, int]] = set()
    for b in rng.sample(live.tolist(), len(live)):
        v = int(graph.producer[b])
        if before[v] and ("sink", v) not in seen:
            seen.add(("sink", v))
            group = set(_closure(v, succ, before))
            if order[t] not in group:  # the node at the peak needs v: v cannot go past it
                rest = [w for w in order if w not in group]
                kept = [w for w in order if w in group]
                cut = t + 1 - len(group)  # just after the peak node, in ``rest``
                moves.append(rest[:cut] + kept + rest[cut:])
                moves.append(_latest(rest, kept, succ))
        for u in set(graph.users[b]):
            if not before[u] and ("hoist", u) not in seen:
                seen.add(("hoist", u))
                group = set(_closure(u, graph.preds, ~before))
                rest = [w for w in order if w not in group]
                kept = [w for w in order if w in group]
                at = _earliest(rest, kept, graph.preds)
                if at <= t:  # else it needs the peak node itself: it cannot go before it
                    moves.append(rest[:t] + kept + rest[t:])
                    moves.append(rest[:at] + kept + rest[at:])
    return moves


def _latest(rest: list[int], kept: list[int], succ: Sequence[Sequence[int]]) -> list[int]:
    """``kept`` inserted into ``rest`` as late as its successors allow."""
    members = set(kept)
    where = {w: k for k, w in enumerate(rest)}
    at = min((where[s] for w in kept for s in succ[w] if s not in members), default=len(rest))
    return rest[:at] + kept + rest[at:]


def _earliest(rest: list[int], kept: list[int], preds: Sequence[Sequence[int]]) -> int:
    """The earliest index in ``rest`` where ``kept`` can go: after its outside predecessors."""
    members = set(kept)
    where = {w: k for k, w in enumerate(rest)}
    return max((where[p] + 1 for w in kept for p in preds[w] if p not in members), default=0)


# ---------------------------------------------------------------------------------------------
# Exact, for small graphs
# ---------------------------------------------------------------------------------------------


def exact(graph: OpGraph, *, max_states: int = 200_000, deadline: float = float("inf"),
          steps: StepBudget | None = None) -> list[int] | None:
    """An order with the lowest possible peak, or None if the search would pass ``max_states``
    sets of run nodes (or the deadline): the whole graph as one window of
    :func:`exact_window` (the search recurses once per node: small graphs only)."""
    return exact_window(graph, list(graph.topological_order), 0, len(graph), max_states=max_states,
                        deadline=deadline, steps=steps)


class _TooLarge(Exception):
    pass
