"""What one node of the exact search costs, in work units fixed by the input.

A node budget alone is deterministic but not a measure of work: a node of minimalloc's
challenging suite (200-450 buffers) costs 40-130 us, one of the idealloc pangu_2.6B (18,692
buffers) a quarter of a second, so a node budget sized for the first runs for minutes on the
second and the clock ends it instead (an answer that depends on the machine). What a node
reads is its buffers and the floor test's (section, member) pairs (``Sections`` table: every
buffer once per section it spans), so a node is charged that many work units; on problems
whose table passes :data:`~tensorarena.planning.exact_node.MEMBERS_LIMIT` the floor is a
scatter (``np.minimum.at``), three times dearer per pair, and charged so. The charge is a
function of the input alone, the same for both engines and every node, so ``work = nodes x
node_work`` and a work budget is a node budget scaled by the problem's size at the start.
Measured per-node costs (bench/RESULTS.md) track it within a factor of three from 150 to
19,000 buffers; a count per node of what it really touched would track it closer, but would
have to be kept identically in both engines' hot loops.
"""

from __future__ import annotations

from tensorarena.planning.exact_node import MEMBERS_LIMIT
from tensorarena.planning.exact_sections import Sections

__all__ = ["SCATTERED_WEIGHT", "node_budget", "node_work"]

#: Work units per (section, member) pair when the floor test scatters (no section table):
#: ~19 ns a pair on pangu_2.6B against 6-8 ns through the table on resnet50, G_1 and J.
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
