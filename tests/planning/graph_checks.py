"""Invariants every front end's result must satisfy (shared by the torch and ONNX tests)."""

from __future__ import annotations

from tensorarena.planning import GraphProblem, naive, validate


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
