"""Invariants every front end's result must satisfy (shared by the torch and ONNX tests)."""

from __future__ import annotations

from tensorarena.planning import GraphProblem, naive, validate
from tensorarena.planning.op_graph import OpGraph


def check_consistent(gp: GraphProblem) -> None:
    """Lifetimes inside the graph, planned and unplanned apart, aliases resolved, outputs live to
    the end, and the naive (no-reuse) plan valid."""
    ids = {b.id for b in gp.problem.buffers}
    for b in gp.problem.buffers:
        assert 0 <= b.start < b.end <= gp.steps
    assert not ids & set(gp.unplanned)
    for alias, root in gp.aliases.items():
        assert root in ids or root in gp.unplanned
        assert alias not in ids
    for out in gp.outputs:
        assert next(b for b in gp.problem.buffers if b.id == out).end == gp.steps
    validate(gp.problem, naive(gp.problem))


def forced_live_bound(graph: OpGraph) -> int:
    """No order of ``graph`` peaks lower: while a node runs, every buffer made by one of its
    ancestors (or itself) and used by one of its descendants (or itself, or a graph output) is
    necessarily live. The largest such total over all nodes, by bitsets of ancestors and
    descendants: a weaker bound than :class:`~tensorarena.planning.cut_bound.CutBound`'s, and
    written without it, so the tests compare the two."""
    n = len(graph)
    order = graph.topological_order
    ancestors = [0] * n
    for v in order:
        mask = 1 << v
        for p in graph.preds[v]:
            mask |= ancestors[p]
        ancestors[v] = mask
    descendants = [0] * n
    for v in reversed(order):
        mask = 1 << v
        for s in graph.successors[v]:
            mask |= descendants[s]
        descendants[v] = mask
    producers = graph.producer.tolist()
    users = [sum(1 << u for u in set(us)) for us in graph.users]
    best = 0
    for x in range(n):
        above, below = ancestors[x], descendants[x]
        total = 0
        for b, size in enumerate(graph.sizes):
            if above >> producers[b] & 1 and (b in graph.outputs or users[b] & below):
                total += size
        best = max(best, total)
    return best
