"""Work budgets: the same answer under any time limit that does not bind, and what ended a search.

The node counts here are the search's own and the same on any machine; no test is timed.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from instances import BUDGETED, aligned_instance

from tensorarena.errors import InvalidArgumentError, PlanDoesNotFitError
from tensorarena.planning import StopReason, exact, plan, solve_exact, staged_search
from tensorarena.planning.exact_search import Solver
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


# ---------------------------------------------------------------------------------------------
# auto never loses to its parts; the probes of a minimisation
# ---------------------------------------------------------------------------------------------


def _outcome(planner: str, capacity: int, node_limit: int) -> tuple[object, ...]:
    try:
        result = plan(BUDGETED, planner, capacity=capacity, node_limit=node_limit)
    except PlanDoesNotFitError as missed:
        statistics = missed.plan.statistics
        assert statistics is not None
        validate(BUDGETED, missed.plan)
        return False, missed.proven, statistics.nodes, statistics.stopped_by
    validate(BUDGETED, result)
    assert result.statistics is not None
    return True, result.height, result.statistics.nodes, result.statistics.stopped_by


def test_auto_decides_as_exact_does_and_the_heuristics_spend_none_of_the_budget() -> None:
    # 36 is proven infeasible in exactly 1193 nodes: the budget at that boundary and one less.
    alone = solve_exact(BUDGETED, capacity=36, node_limit=None)
    assert alone.proven and not alone.feasible and alone.nodes == 1193
    assert _outcome("auto", 36, 1193) == _outcome("exact", 36, 1193) == (
        False, True, 1193, StopReason.PROVEN)
    assert _outcome("auto", 36, 1192) == _outcome("exact", 36, 1192) == (
        False, False, 1192, StopReason.BUDGET)
    fits = _outcome("auto", 37, 5000)
    assert fits[:2] == (True, 37) and fits == _outcome("exact", 37, 5000)
    assert fits[2] == solve_exact(BUDGETED, capacity=37).nodes


def test_auto_asks_the_exact_search_before_the_sweep_on_a_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real_search, real_sweep = staged_search.solve_exact, staged_search.long_lived_first_planner

    def search(*args: Any, **kwargs: Any) -> Any:
        calls.append("exact")
        return real_search(*args, **kwargs)

    def sweep(*args: Any, **kwargs: Any) -> Any:
        calls.append("sweep")
        return real_sweep(*args, **kwargs)

    monkeypatch.setattr(staged_search, "solve_exact", search)
    monkeypatch.setattr(staged_search, "long_lived_first_planner", sweep)
    plan(BUDGETED, capacity=37)
    assert calls == ["exact"]  # it fits: nothing more to do
    calls.clear()
    with pytest.raises(PlanDoesNotFitError):
        plan(BUDGETED, capacity=37, node_limit=5)  # undecided: the sweep may still find a fit
    assert calls == ["exact", "sweep"]
    calls.clear()
    plan(BUDGETED, gap=0)  # a minimisation lowers the plan with the sweep first
    assert calls == ["sweep", "exact"]


def test_every_probe_but_the_last_gets_a_fixed_share(monkeypatch: pytest.MonkeyPatch) -> None:
    limits: list[int | None] = []
    real = Solver.solve

    def solve(self: Solver, *args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["node_limit"])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Solver, "solve", solve)
    monkeypatch.setattr(exact, "PROBE_NODES", 100)
    result = solve_exact(aligned_instance(1, 14), node_limit=None, work_limit=None, gap=0)
    assert result.proven and result.plan is not None and result.plan.height == 53
    # Each probe below the last candidate capacity gets 100 nodes, not what is left: a probe
    # that cannot settle its capacity in them gives up and the bisection goes on above it.
    assert limits[0] == 100 and set(limits) == {100, None}
    assert limits[-1] is None  # the last candidate capacity: all that is left
