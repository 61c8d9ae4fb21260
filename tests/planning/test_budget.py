"""Work budgets: the same answer under any time limit that does not bind, and what ended a search.

The node counts here are the search's own and the same on any machine; no test is timed.
"""

from __future__ import annotations

import math
import time

import pytest
from instances import BUDGETED, aligned_instance

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import StopReason, plan, solve_exact
from tensorarena.planning.problem import Buffer, Problem
from tensorarena.planning.validate import validate

# Optimum 37 above the lower bound 33, proven in 3236 nodes.
PROBLEM = BUDGETED


@pytest.mark.parametrize("capacity", [None, 36, 37])
def test_two_generous_time_limits_give_the_same_answer_and_nodes(capacity: int | None) -> None:
    # 36 is infeasible, 37 fits: the decision version, both ways, and the optimisation.
    for budget in (500, 3236, None):
        runs = [solve_exact(PROBLEM, capacity=capacity, node_limit=budget, time_limit=limit)
                for limit in (60.0, math.inf)]
        first, second = runs
        assert (first.nodes, first.stopped_by, first.proven, first.feasible) == (
            second.nodes, second.stopped_by, second.proven, second.feasible)
        if first.plan is not None:
            assert second.plan is not None and first.plan.offsets == second.plan.offsets
            validate(PROBLEM, first.plan)


def test_a_loaded_machine_gets_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    # Load, simulated: every look at the clock finds a second gone (38 looks against a 50 s
    # limit). Sharing the time out among the probes, as the search used to, cut the first probe
    # short under load (10,142 nodes, unproven); shared-out nodes do not notice.
    problem = aligned_instance(1, 14)
    runs = []
    for step in (0.0, 1.0):
        looks = [0]

        def clock(step: float = step, looks: list[int] = looks) -> float:
            looks[0] += 1
            return looks[0] * step

        with monkeypatch.context() as patch:
            patch.setattr(time, "monotonic", clock)
            runs.append(solve_exact(problem, time_limit=50.0, gap=0))
        assert looks[0] < 50  # the time limit never bound
    idle, loaded = runs
    assert idle.plan is not None and loaded.plan is not None
    validate(problem, loaded.plan)
    assert (idle.nodes, idle.proven, idle.plan.offsets) == (
        loaded.nodes, loaded.proven, loaded.plan.offsets)
    assert idle.proven and idle.nodes == 8253


def test_auto_gives_the_same_plan_under_two_generous_time_limits() -> None:
    plans = [plan(PROBLEM, "auto", gap=0, node_limit=700, time_limit=limit)
             for limit in (60.0, 1e6)]
    for result in plans:
        validate(PROBLEM, result)
    first, second = (p.statistics for p in plans)
    assert first is not None and second is not None
    assert plans[0].offsets == plans[1].offsets
    assert first.nodes == second.nodes == 700
    assert first.stopped_by is second.stopped_by is StopReason.BUDGET
    assert (first.node_limit, first.time_limit, second.time_limit) == (700, 60.0, 1e6)


def test_a_budget_exactly_spent_proves_and_one_node_less_ends_by_budget() -> None:
    full = solve_exact(PROBLEM, gap=0)
    assert full.proven and full.stopped_by is StopReason.PROVEN and full.nodes == 3236
    exact_fit = solve_exact(PROBLEM, node_limit=full.nodes)
    assert exact_fit.proven and exact_fit.stopped_by is StopReason.PROVEN
    short = solve_exact(PROBLEM, node_limit=full.nodes - 1)
    assert not short.proven and short.stopped_by is StopReason.BUDGET
    assert (short.nodes, short.node_limit) == (full.nodes - 1, full.nodes - 1)


def test_a_tiny_budget_ends_the_decision_by_budget_and_says_so() -> None:
    result = solve_exact(PROBLEM, capacity=36, node_limit=10, time_limit=math.inf)
    assert (result.stopped_by, result.nodes, result.proven) == (StopReason.BUDGET, 10, False)


def test_a_tiny_time_limit_says_time_ended_it() -> None:
    for capacity in (None, 36):
        result = solve_exact(PROBLEM, capacity=capacity, time_limit=0.0)
        assert result.stopped_by is StopReason.TIME_LIMIT and not result.proven
        assert result.time_limit == 0.0
    planned = plan(PROBLEM, "exact", gap=0, time_limit=0.0)
    validate(PROBLEM, planned)
    assert planned.statistics is not None
    assert planned.statistics.stopped_by is StopReason.TIME_LIMIT


def test_plan_says_what_ended_it_when_nothing_needed_a_search() -> None:
    easy = Problem([Buffer("a", 0, 2, 8), Buffer("b", 1, 3, 8)])
    result = plan(easy)
    assert result.statistics is not None
    assert result.statistics.stopped_by is StopReason.PROVEN and result.statistics.nodes == 0
    assert plan(easy, "greedy_size").statistics.stopped_by is StopReason.NOT_RUN  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_a_bad_node_limit_is_refused_before_planning(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="node_limit"):
        plan(PROBLEM, node_limit=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="node_limit"):
        solve_exact(PROBLEM, node_limit=bad)  # type: ignore[arg-type]
