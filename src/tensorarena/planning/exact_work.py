"""What one node of the exact search costs, in work units fixed by the input.

A node budget alone is deterministic but not a measure of work: a node of a trace with tens of
thousands of buffers costs three orders of magnitude more than one of minimalloc's challenging
suite (bench/RESULTS.md), so a node budget sized for the suite runs into the clock on the trace,
and the clock's answer depends on the machine. What a node reads is its buffers and the floor
test's (section, member) pairs (every buffer once per time section it spans), so a node is
charged that many work units; on problems whose pairs pass
:data:`~tensorarena.planning.exact_node.MEMBERS_LIMIT` the floor is a scatter
(``np.minimum.at``), dearer per pair (:data:`SCATTERED_WEIGHT`), and charged so. The charge is a
function of the input alone, the same for both engines and every node, so ``work = nodes x
node_work`` and a work budget is a node budget scaled by the problem's size at the start. A
count of what each node really touched would track the cost closer, but would have to be kept
identically in both engines' hot loops.
"""

from __future__ import annotations

import numpy as np

from tensorarena.planning.bounds import distinct
from tensorarena.planning.exact_node import MEMBERS_LIMIT
from tensorarena.planning.exact_sections import Sections
from tensorarena.planning.problem import Problem

__all__ = ["SCATTERED_WEIGHT", "can_dive", "node_budget", "node_work", "problem_node_work"]

#: Work units per (section, member) pair when the floor test scatters (no section table): its
#: cost per pair against the table's, measured (bench/RESULTS.md).
SCATTERED_WEIGHT = 3


def node_work(sections: Sections) -> int:
    """Work units one search node of ``sections`` is charged: its buffers plus the
    (section, member) pairs its floor test reads (weighted when it must scatter them)."""
    pairs = int((sections.last - sections.first).sum())
    weight = 1 if pairs <= MEMBERS_LIMIT else SCATTERED_WEIGHT
    return max(1, len(sections) + weight * pairs)


def node_budget(node_limit: int | None, work_limit: int | None, sections: Sections) -> int | None:
    """The nodes a search of ``sections`` may visit under both budgets (``None``: no limit)."""
    if work_limit is None:
        return node_limit
    nodes = work_limit // node_work(sections)
    return nodes if node_limit is None else min(node_limit, nodes)


def problem_node_work(problem: Problem) -> int:
    """:func:`node_work` of ``problem``'s sections, from its lifetimes alone (without the overlap
    lists that building the sections costs)."""
    live = [b for b in problem.buffers if b.nbytes > 0]
    if not live:
        return 1
    starts = np.fromiter((b.start for b in live), np.int64, len(live))
    ends = np.fromiter((b.end for b in live), np.int64, len(live))
    times = distinct(np.concatenate((starts, ends)))  # np.unique imports numpy.ma
    pairs = int((np.searchsorted(times, ends) - np.searchsorted(times, starts)).sum())
    weight = 1 if pairs <= MEMBERS_LIMIT else SCATTERED_WEIGHT
    return max(1, len(live) + weight * pairs)


def can_dive(problem: Problem, node_limit: int | None, work_limit: int | None) -> bool:
    """Whether a search of ``problem`` under these budgets may visit a node per buffer: what
    one dive to a complete plan takes. Below that it can only return its seed."""
    nodes = node_limit
    if work_limit is not None:
        affordable = work_limit // problem_node_work(problem)
        nodes = affordable if nodes is None else min(nodes, affordable)
    return nodes is None or nodes >= sum(1 for b in problem.buffers if b.nbytes > 0)
