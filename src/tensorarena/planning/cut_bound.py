"""A lower bound on the peak of every order of a graph, by minimum cuts: how far reordering can go.

Counting, while a node ``x`` runs, only the buffers that *must* be live then (made by an
ancestor, used by a descendant; the tests keep that bound as a reference) misses what
is live in every order without any single buffer being forced: in a GPT-2 training graph the
forward computes ``3 * x**2`` for GELU's backward, so at the loss either ``x``, ``x**2`` or
``3 * x**2`` is live, whichever order runs them, yet none of the three is forced. Here the bound
at ``x`` is exact instead: the fewest bytes live while ``x`` runs over every set of nodes that
can have run before it (all its ancestors, none of its descendants, closed under
predecessors). That minimum is a minimum cut, since a buffer costs its bytes when its producer
has run and some user has not (:class:`CutBound`); the peak of every order is at least the
largest such minimum over the nodes. A node's bound cannot see that *some* node of a set runs
last: at the end of a training graph, the last gradient made holds every other gradient and its
own inputs. :meth:`CutBound.last_of` takes the fewest bytes live at the last of a set of nodes,
the least over which of them runs last of its cut with the others run, and :meth:`CutBound.bound`
counts it on the producers of the graph's outputs.

Every order's live bytes at ``x``'s step bound the minimum at ``x`` from above, so
:meth:`CutBound.bound` visits nodes by decreasing live bytes in a given order and stops where
they fall to the bound found so far: it returns the largest minimum over *all* nodes without
cutting at each. How close it comes on real models: ``tensorarena bench schedule`` (its
``order_bound``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.budget import StepBudget
from tensorarena.planning.op_graph import OpGraph, check_order

__all__ = ["CutBound"]


class CutBound:
    """Minimum-cut lower bounds on the live bytes while each node of ``graph`` runs."""

    def __init__(self, graph: OpGraph) -> None:
        if not isinstance(graph, OpGraph):
            raise InvalidArgumentError(f"CutBound takes an OpGraph, got {type(graph).__name__}")
        self.graph = graph
        n = len(graph)
        order = graph.topological_order
        succ = graph.successors
        self._ancestors = [0] * n  # bitsets, each node included
        for v in order:
            mask = 1 << v
            for p in graph.preds[v]:
                mask |= self._ancestors[p]
            self._ancestors[v] = mask
        self._descendants = [0] * n
        for v in reversed(order):
            mask = 1 << v
            for s in succ[v]:
                mask |= self._descendants[s]
            self._descendants[v] = mask
        self._producer = graph.producer.tolist()
        # Users other than the producer, and the same as a bitset.
        self._users = [tuple(set(us) - {p}) for us, p in zip(graph.users, self._producer,
                                                              strict=True)]
        self._user_masks = [sum(1 << u for u in us) for us in self._users]
        self._infinite = sum(graph.sizes) + 1

    def at(self, x: int, *, run: Iterable[int] = ()) -> int:
        """The fewest bytes live while node ``x`` runs, over every order of the graph that runs
        the nodes ``run`` (none of them a descendant of ``x``) before it."""
        return self._at(x, run)[0]

    def _at(self, x: int, run: Iterable[int]) -> tuple[int, int]:
        """:meth:`at`, and the size of its flow network (nodes + edges): its work units."""
        graph, producer = self.graph, self._producer
        before = self._ancestors[x] & ~(1 << x)  # has run, in every order
        for v in run:
            before |= self._ancestors[v]
        after = self._descendants[x]  # has not run (x itself included)
        if before & after:
            raise InvalidArgumentError(f"node {graph.names[x]!r} cannot run after all of run")
        index = {v: k for k, v in enumerate(
            v for v in range(len(graph)) if not (before | after) >> v & 1)}
        source, sink = len(index), len(index) + 1
        nodes = len(index) + 2
        edges: list[tuple[int, int, int]] = []
        infinite = self._infinite
        for v, k in index.items():  # a node that has run has its predecessors run too
            edges.extend((k, index[p], infinite) for p in graph.preds[v] if p in index)
        forced = 0
        for b, size in enumerate(graph.sizes):
            p = producer[b]
            if p == x:
                forced += size  # made now
                continue
            if after >> p & 1:
                continue  # made later: never live while x runs
            needed_later = b in graph.outputs or self._user_masks[b] & after
            free_users = [index[u] for u in self._users[b] if u in index]
            if before >> p & 1:
                if needed_later:
                    forced += size
                    continue
                tail = source  # live unless every free user has run
            elif needed_later:
                edges.append((index[p], sink, size))  # live once its producer has run
                continue
            else:
                tail = index[p]
            if len(free_users) == 1:
                edges.append((tail, free_users[0], size))
            elif free_users:
                edges.append((tail, nodes, size))
                edges.extend((nodes, u, infinite) for u in free_users)
                nodes += 1
        return forced + _max_flow(nodes, edges, source, sink), nodes + len(edges)

    def bound(self, order: Sequence[int], *, floor: int = 0, deadline: float = float("inf"),
              steps: StepBudget | None = None) -> tuple[int, bool]:
        """The largest :meth:`at` over the nodes, at least ``floor`` and :meth:`last_of` the
        outputs' producers, and whether it is complete. Nodes are visited by decreasing live
        bytes in ``order`` (any valid order), which bound their :meth:`at` from above, until
        those fall to the bound so far; at the deadline, or when ``steps`` run out (a max flow
        costs the nodes and edges of its network), the bound found so far is returned, still a
        lower bound, as incomplete."""
        check_order(self.graph, order)
        if time.monotonic() > deadline:
            return floor, False
        profile = self.graph.profile(order)
        # First: it raises the bound that prunes the nodes below.
        best = max(floor, self.last_of({int(self._producer[b]) for b in self.graph.outputs}))
        for t in sorted(range(len(order)), key=lambda k: -int(profile[k])):
            if profile[t] <= best:
                return best, True
            if time.monotonic() > deadline or (steps is not None and steps.exhausted):
                return best, False
            value, work = self._at(order[t], ())
            best = max(best, value)
            if steps is not None:
                steps.spend(work)
        return best, True

    def last_of(self, nodes: Iterable[int]) -> int:
        """The fewest bytes live while the last of ``nodes`` runs, over every order: one of
        them runs after all the others. On the graph's outputs' producers this sees what no
        single node's bound can: the last gradient made holds every other one, and its inputs."""
        members = set(nodes)
        lowest: int | None = None
        for y in members:
            others = members - {y}
            if self._descendants[y] & sum(1 << z for z in others):
                continue  # another of them depends on y: y is never the last
            live = self.at(y, run=others)
            lowest = live if lowest is None else min(lowest, live)
        return lowest or 0


def _max_flow(nodes: int, edges: list[tuple[int, int, int]], source: int, sink: int) -> int:
    """Dinic's maximum flow (the value of a minimum cut), iterative: regions have thousands of
    nodes, deeper than the interpreter's recursion limit."""
    heads: list[list[int]] = [[] for _ in range(nodes)]
    target: list[int] = []
    capacity: list[int] = []
    for a, b, c in edges:
        heads[a].append(len(target))
        target.append(b)
        capacity.append(c)
        heads[b].append(len(target))
        target.append(a)
        capacity.append(0)
    flow = 0
    while True:
        level = [-1] * nodes
        level[source] = 0
        queue = deque([source])
        while queue:
            a = queue.popleft()
            for e in heads[a]:
                if capacity[e] and level[target[e]] < 0:
                    level[target[e]] = level[a] + 1
                    queue.append(target[e])
        if level[sink] < 0:
            return flow
        next_edge = [0] * nodes
        path: list[int] = []  # edges from the source to ``a``
        a = source
        while True:
            if a == sink:
                pushed = min(capacity[e] for e in path)
                for e in path:
                    capacity[e] -= pushed
                    capacity[e ^ 1] += pushed
                flow += pushed
                path.clear()
                a = source
                continue
            out = heads[a]
            while next_edge[a] < len(out):
                e = out[next_edge[a]]
                if capacity[e] and level[target[e]] == level[a] + 1:
                    break
                next_edge[a] += 1
            if next_edge[a] < len(out):
                e = out[next_edge[a]]
                path.append(e)
                a = target[e]
            elif a == source:
                break  # the flow of this level graph is blocking
            else:  # a dead end: retreat and never come back here in this phase
                level[a] = -1
                e = path.pop()
                a = target[e ^ 1]
                next_edge[a] += 1
