"""Work budgets for the searches, and the record of what ended one.

A search that stops on the clock gives an answer that depends on the machine and on what else it
runs: the same problem planned twice can come back at two heights. So every search that may run
long (the exact search behind ``auto`` and ``exact``, :func:`~tensorarena.planning.reorder`'s
search over orders) also takes a budget in *work units* that cost the same everywhere: search
nodes, and work units that weigh a node by the problem's size
(:mod:`~tensorarena.planning.exact_work`), for the exact search; steps for the reordering. The
defaults below are chosen so that the budget, not the clock, ends a search on the public suites;
the wall-clock limit stays as an outer bound for a machine far slower than ours or a problem far
larger, and the statistics say which ended it (:class:`StopReason`) and how much of each was
used.

What the defaults cost in seconds on minimalloc's challenging suite, and how many nodes its
hardest instances need: ``bench/RESULTS.md``.
"""

from __future__ import annotations

import enum

__all__ = ["DEFAULT_NODE_LIMIT", "DEFAULT_REORDER_PLAN_NODES", "DEFAULT_REORDER_PLAN_WORK",
           "DEFAULT_REORDER_STEPS", "DEFAULT_WORK_LIMIT", "StepBudget", "StopReason"]

#: Exact-search nodes ``auto`` and ``exact`` may visit by default (all of their questions
#: together): E of minimalloc's challenging suite needs ~192,000 at 2^20.
DEFAULT_NODE_LIMIT = 250_000

#: Work units ``auto`` and ``exact`` may spend by default, on top of the node budget: a node
#: costs its problem's buffers plus its floor test's (section, member) pairs
#: (:func:`~tensorarena.planning.exact_work.node_work`). The heaviest node of minimalloc's
#: challenging suite (J: 16,861 units) still gets the whole node budget, so the suite's answers
#: are those of the node budget alone; the idealloc traces get a few hundred nodes (pangu_2.6B:
#: 114, resnet50: 27,970), which their nodes' cost makes as long as the suite's budget.
DEFAULT_WORK_LIMIT = 4_500_000_000

#: Work steps :func:`~tensorarena.planning.reorder` may take by default. A step is a node (or an
#: edge) looked at: scoring an order costs the graph's nodes, a max flow of the cut bound its
#: network's nodes and edges, an exact state its window's nodes. 9-29 us a step on random graphs
#: of 60-1,000 nodes on the loaded 2-core VM: 10-30 s, inside the 60 s outer bound.
DEFAULT_REORDER_STEPS = 1_000_000

#: Exact-search nodes and work units each plan :func:`~tensorarena.planning.reorder` makes at the
#: end may spend, so that the plans, which choose among the orders, end by budget: on random
#: graphs of 60-1,000 nodes under a second each on the loaded 2-core VM (pure build), inside
#: the default two-second ``plan_time_limit``, which used to end them (and so pick the order).
DEFAULT_REORDER_PLAN_NODES = 20_000
DEFAULT_REORDER_PLAN_WORK = 200_000_000


class StopReason(enum.Enum):
    """What ended a search (``PlanStatistics.stopped_by``, the CLI's ``"stopped_by"``)."""

    #: the answer is final: a plan proven optimal, or the decision answered (a plan that fits
    #: was found, or none can fit)
    PROVEN = "proven"
    #: a plan within the relative ``gap`` of the best bound: nothing more was asked
    GOOD_ENOUGH = "good_enough"
    #: the search ran its course (every move tried, its patience spent) without a proof
    COMPLETE = "complete"
    #: the work budget (nodes, steps) ran out: the same answer on any machine
    BUDGET = "budget"
    #: the wall-clock limit ran out first: the answer may differ on another machine or load
    TIME_LIMIT = "time_limit"
    #: no search ran (the heuristics settled it, or the problem was too large to start one)
    NOT_RUN = "not_run"


class StepBudget:
    """A countdown of work steps that the stages of one search draw on in turn.

    ``limit`` ``None`` never runs out. A stage asks :meth:`spend` before each step and stops
    when it says no; ``used`` is what was spent, the same on any machine.
    """

    __slots__ = ("limit", "used")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0

    def __repr__(self) -> str:
        return f"StepBudget(used={self.used}, limit={self.limit})"

    @property
    def exhausted(self) -> bool:
        """True once every step is spent."""
        return self.limit is not None and self.used >= self.limit

    def left(self) -> int | None:
        """Steps not yet spent (``None``: no limit)."""
        return None if self.limit is None else max(0, self.limit - self.used)

    def spend(self, steps: int = 1) -> bool:
        """Count ``steps`` if any are left (the last spend may go past the limit: a unit of
        work is not cut in two); False, counting nothing, once the budget is spent."""
        if self.exhausted:
            return False
        self.used += steps
        return True

    def share(self, parts: int) -> StepBudget:
        """A budget of this one's steps left divided by ``parts``, for one of ``parts`` stages
        (spend it back with ``self.spend(share.used)``)."""
        left = self.left()
        return StepBudget(None if left is None else left // max(1, parts))
