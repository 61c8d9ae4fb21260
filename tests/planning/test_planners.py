"""plan() and the registry of named planners: names, capacity, alignment, auto's contract.

auto's contract is checked against the real exact search on problems small enough for it to
settle at once; a spy records how plan() called it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorarena.errors import (
    InfeasibleError,
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidSizeError,
)
from tensorarena.planning import heuristics, staged_search
from tensorarena.planning.budget import DEFAULT_WORK_LIMIT, StopReason
from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.exact import ExactResult, solve_exact
from tensorarena.planning.peak_stack import PEAK_STACK_WORK, PeakStackResult
from tensorarena.planning.planners import (
    PLANNERS,
    PlanDoesNotFitError,
    UnknownNameError,
    overlapping_pairs,
    plan,
)
from tensorarena.planning.problem import Buffer, Plan, PlanStatistics, Problem, lower_bound
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"
HEURISTIC_NAMES = sorted(heuristics.HEURISTICS)


def tight() -> Problem:
    """A problem every greedy misses (they need 6): its optimum is the lower bound, 5."""
    return Problem(
        [Buffer("a", 1, 3, 3), Buffer("b", 1, 4, 2), Buffer("c", 3, 6, 1), Buffer("d", 4, 5, 3)]
    )


def above_its_bound() -> Problem:
    """Optimum 14 above the lower bound 12 (4-aligned 3, 3 and 6 bytes live at once); the
    portfolio needs 15. At capacity 14 the decision search finds a plan it cannot call optimal."""
    return Problem([Buffer("a", 4, 6, 3, 4), Buffer("b", 4, 7, 3, 4), Buffer("c", 5, 7, 6, 4),
                    Buffer("d", 2, 4, 4)])


Calls = list[dict[str, Any]]


@pytest.fixture
def spy_exact(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Record every call plan() makes to the real ``solve_exact``, with its result."""
    calls: Calls = []

    def spy(problem: Problem, **kwargs: Any) -> ExactResult:
        result = solve_exact(problem, **kwargs)
        calls.append({"problem": problem, **kwargs, "result": result})
        return result

    monkeypatch.setattr(staged_search, "solve_exact", spy)
    yield calls


@pytest.fixture
def no_peak_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """``auto`` without its peak stack (the plan given back unchanged): the other stages alone."""
    calls: Calls = []

    def unchanged(problem: Problem, plan: Plan, **kwargs: Any) -> PeakStackResult:
        calls.append({"problem": problem, "plan": plan, **kwargs})
        return PeakStackResult(plan, "", 0, 0, StopReason.COMPLETE)

    monkeypatch.setattr(staged_search, "peak_stack", unchanged)
    yield calls


@pytest.fixture
def no_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """The real ``solve_exact`` with a budget of no nodes: it returns its seed, unproven."""
    calls: Calls = []

    def starved(problem: Problem, **kwargs: Any) -> ExactResult:
        result = solve_exact(problem, **{**kwargs, "node_limit": 0})
        calls.append({"problem": problem, **kwargs, "result": result})
        return result

    monkeypatch.setattr(staged_search, "solve_exact", starved)
    yield calls


def test_registry_names_every_planner() -> None:
    assert set(PLANNERS) == {"auto", "exact", "long_lived_first", *heuristics.HEURISTICS}
    for name in PLANNERS:
        assert PLANNERS[name].__doc__


@pytest.mark.parametrize("name", HEURISTIC_NAMES)
def test_named_heuristics_through_plan(name: str) -> None:
    problem = read_problem(DATA / "pisarchyk_lee.csv")
    started = time.perf_counter()
    result = plan(problem, name)
    elapsed = time.perf_counter() - started
    validate(problem, result)
    assert result.planner.startswith(name)
    statistics = result.statistics
    assert statistics is not None
    assert statistics.lower_bound == 124 and type(statistics.lower_bound) is int
    assert (statistics.nodes, statistics.exact_skipped) == (0, False)  # no search ran
    assert 0 < statistics.seconds <= elapsed  # plan()'s own wall time, measured inside it


def test_statistics_are_one_frozen_typed_record() -> None:
    result = plan(tight(), "auto", time_limit=5.0)
    statistics = result.statistics
    assert isinstance(statistics, PlanStatistics)
    assert {f.name: f.type for f in dataclasses.fields(PlanStatistics)} == {
        "seconds": "float", "lower_bound": "int", "nodes": "int", "exact_skipped": "bool",
        "bound": "int", "stopped_by": "StopReason", "node_limit": "int | None",
        "time_limit": "float", "work": "int", "work_limit": "int | None",
    }
    assert type(statistics.nodes) is int and type(statistics.exact_skipped) is bool
    with pytest.raises(dataclasses.FrozenInstanceError):
        statistics.nodes = 0  # type: ignore[misc]
    # A plan no planner made carries none, rather than zeros that look measured.
    assert Plan(tight(), result.offsets).statistics is None


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 5), st.integers(0, 30)),
                   max_size=12),
    alignment=st.sampled_from([None, 16]),
)
def test_auto_is_valid_and_never_worse_than_portfolio(
    sizes: list[tuple[int, int, int]], alignment: int | None
) -> None:
    problem = Problem(Buffer(f"b{i}", s, s + n, z) for i, (s, n, z) in enumerate(sizes))
    result = plan(problem, alignment=alignment, time_limit=0.5)
    validate(problem if alignment is None else problem.with_alignment(alignment), result)
    assert result.height <= heuristics.portfolio(problem, alignment=alignment).height
    if result.height == lower_bound(problem):
        assert result.optimal


def test_auto_stops_at_the_lower_bound_without_searching(spy_exact: Calls) -> None:
    problem = read_problem(DATA / "pisarchyk_lee.csv")
    result = plan(problem)
    assert result.height == 124 and result.optimal
    assert result.planner.startswith("auto:portfolio:")
    assert spy_exact == []
    assert result.statistics is not None and result.statistics.nodes == 0


def test_auto_runs_exact_seeded_with_the_portfolio(spy_exact: Calls) -> None:
    problem = tight()
    portfolio = heuristics.portfolio(problem)
    assert portfolio.height > lower_bound(problem) == 5
    result = plan(problem, time_limit=2.0)
    validate(problem, result)
    assert result.height == 5 and result.optimal
    assert result.planner == "auto:exact"
    (call,) = spy_exact
    assert call["initial"].offsets == portfolio.offsets
    assert 0 < call["time_limit"] <= 2.0
    assert call["capacity"] is None
    assert result.statistics is not None
    assert result.statistics.nodes == call["result"].nodes > 0


def test_auto_keeps_the_portfolio_when_exact_finds_nothing(no_nodes: Calls,
                                                          no_peak_stack: Calls) -> None:
    problem = tight()
    result = plan(problem, time_limit=2.0)
    (call,) = no_nodes
    assert call["result"].nodes == 0 and not call["result"].proven
    assert result.offsets == heuristics.portfolio(problem).offsets
    assert result.planner.startswith("auto:portfolio:")  # not labelled as the search's find
    assert not result.optimal
    assert len(no_peak_stack) == 1  # asked, after the search, and it changed nothing


def test_auto_stacks_the_peak_when_the_search_finds_nothing(no_nodes: Calls) -> None:
    problem = tight()  # the portfolio needs 6, the bound is 5
    result = plan(problem, time_limit=2.0)
    validate(problem, result)
    assert result.height == 5 and result.optimal
    assert result.planner.startswith("auto:peak_stack:")
    assert result.statistics is not None and result.statistics.work > 0


def test_the_peak_stack_gets_only_what_the_search_left_of_the_work_budget(
    no_peak_stack: Calls,
) -> None:
    problem = above_its_bound()
    result = plan(problem, time_limit=5.0, node_limit=1)
    assert result.statistics is not None
    (call,) = no_peak_stack
    assert call["work_limit"] == min(PEAK_STACK_WORK, DEFAULT_WORK_LIMIT - result.statistics.work)
    no_peak_stack.clear()
    spent = plan(problem, time_limit=5.0, node_limit=1, work_limit=result.statistics.work)
    assert no_peak_stack[0]["work_limit"] == 0  # nothing left: the plan stands
    assert spent.height == result.height
    # A decision problem that fits is answered as it is: no stack.
    no_peak_stack.clear()
    plan(problem, capacity=100)
    assert no_peak_stack == []


def test_auto_reports_proven_infeasibility(spy_exact: Calls) -> None:
    with pytest.raises(PlanDoesNotFitError) as info:
        plan(tight(), capacity=4)
    assert info.value.proven
    assert info.value.lower_bound == 5 and info.value.capacity == 4
    assert spy_exact[0]["capacity"] == 4
    validate(tight(), info.value.plan)


def test_a_capacity_asks_does_it_fit_and_stops_at_the_first_fit(spy_exact: Calls) -> None:
    problem = above_its_bound()  # the portfolio needs 15, the optimum is 14
    result = plan(problem, capacity=100)
    assert result.height == 15 and not result.optimal  # fits: nothing more was asked
    assert spy_exact == []
    assert result.statistics is not None and result.statistics.nodes == 0


def test_minimize_lowers_a_plan_that_already_fits(spy_exact: Calls) -> None:
    result = plan(tight(), capacity=100, minimize=True)
    assert result.height == 5 and result.optimal
    assert [call["capacity"] for call in spy_exact] == [None]


def test_the_decision_answer_is_the_same_every_run() -> None:
    problem = above_its_bound()
    heights = {plan(problem, capacity=14, time_limit=5.0).offsets for _ in range(3)}
    assert len(heights) == 1


def test_minimize_lowers_a_decision_answer_with_the_time_left(
    spy_exact: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The long-lived-first stage finds 14 on its own; this is about the search's two questions.
    monkeypatch.setattr(staged_search, "long_lived_first_planner",
                        lambda problem, options, **kw: kw["initial"])
    problem = above_its_bound()
    assert heuristics.portfolio(problem).height == 15 and lower_bound(problem) == 12
    decided = plan(problem, capacity=14, time_limit=5.0)
    assert decided.height == 14 and len(spy_exact) == 1  # the first fit, then stop
    spy_exact.clear()
    result = plan(problem, capacity=14, time_limit=5.0, minimize=True)
    validate(problem, result, capacity=14)
    assert result.height == 14 and result.optimal
    decision, lowering = spy_exact
    assert decision["capacity"] == 14 and decision["result"].feasible
    assert not decision["result"].plan.optimal  # 14 is above the bound: not proven by a find
    assert lowering["capacity"] is None and lowering["initial"].height == 14
    assert lowering["result"].proven
    assert result.statistics is not None
    assert result.statistics.nodes == decision["result"].nodes + lowering["result"].nodes
    assert result.statistics.bound == 14  # proven: 13 does not fit


def test_exact_planner_with_alignment(spy_exact: Calls) -> None:
    problem = tight()
    result = plan(problem, "exact", alignment=8)
    validate(problem.with_alignment(8), result)
    assert result.problem is problem
    (call,) = spy_exact
    assert call["problem"] == problem.with_alignment(8)
    assert call["initial"].problem == problem.with_alignment(8)
    # a-b, b-c and c-d overlap in time: with 8-aligned slots the best is 11 (worked by hand)
    assert result.height == 11 and result.optimal


def test_capacity_that_fits_and_one_that_does_not() -> None:
    problem = read_problem(DATA / "pisarchyk_lee.csv")
    assert plan(problem, "greedy_size", capacity=124).height == 124
    with pytest.raises(PlanDoesNotFitError) as info:
        plan(problem, "naive", capacity=124)
    assert isinstance(info.value, InfeasibleError)
    assert info.value.plan.height == sum(b.nbytes for b in problem.buffers)
    assert info.value.capacity == 124
    assert not info.value.proven
    with pytest.raises(PlanDoesNotFitError) as below:
        plan(problem, "portfolio", capacity=123)
    assert below.value.proven  # the plan is at the lower bound: nothing lower exists


def test_problem_capacity_is_the_default() -> None:
    problem = read_problem(DATA / "toy.12.csv", capacity=11)
    with pytest.raises(PlanDoesNotFitError):
        plan(problem, "portfolio")
    assert plan(problem, "portfolio", capacity=12).height == 12


def test_bad_arguments() -> None:
    problem = read_problem(DATA / "toy.12.csv")
    with pytest.raises(UnknownNameError, match="unknown planner 'nope'"):
        plan(problem, "nope")
    with pytest.raises(InvalidAlignmentError):
        plan(problem, "naive", alignment=12)
    with pytest.raises(InvalidSizeError):
        plan(problem, "naive", capacity=-1)


def test_minimize_without_a_capacity_is_refused_before_planning(spy_exact: Calls) -> None:
    # It used to be dropped without a word: without a capacity there is nothing to lower past.
    with pytest.raises(InvalidArgumentError, match=r"minimize=True .* none was given"):
        plan(above_its_bound(), minimize=True)
    assert spy_exact == []
    problem = read_problem(DATA / "toy.12.csv", capacity=12)  # the problem's own capacity
    assert plan(problem, minimize=True).height == 12


@pytest.mark.parametrize("time_limit", [-1, math.nan, "1", None, True])
def test_a_bad_time_limit_is_an_invalid_argument(time_limit: object) -> None:
    with pytest.raises(InvalidArgumentError, match="time_limit"):
        plan(tight(), "naive", time_limit=time_limit)  # type: ignore[arg-type]


def test_an_infinite_time_limit_means_no_limit() -> None:
    result = plan(tight(), time_limit=math.inf)
    assert result.height == 5 and result.optimal


@pytest.mark.parametrize("planner", [42, None, ["auto"]])
def test_a_planner_that_is_not_a_name(planner: object) -> None:
    with pytest.raises(UnknownNameError, match="expected one of auto, exact"):
        plan(tight(), planner)  # type: ignore[arg-type]


@pytest.mark.parametrize("problem", ["abc", None, [Buffer("a", 0, 1, 4)]])
def test_something_that_is_not_a_problem(problem: object) -> None:
    with pytest.raises(InvalidArgumentError, match="expected a Problem"):
        plan(problem)  # type: ignore[arg-type]


def test_capacity_as_a_size_string_like_a_pool() -> None:
    problem = read_problem(DATA / "toy.12.csv")
    assert plan(problem, "portfolio", capacity="1KiB").height == 12
    with pytest.raises(PlanDoesNotFitError) as info:
        plan(problem, "portfolio", capacity="0.01kB")  # 10 bytes
    assert info.value.capacity == 10
    for bad in ("lots", 1.5, "-4"):
        with pytest.raises(InvalidSizeError, match="capacity"):
            plan(problem, "portfolio", capacity=bad)  # type: ignore[arg-type]


def test_auto_and_exact_with_the_real_search() -> None:
    problem = tight()
    for name in ("auto", "exact"):
        result = plan(problem, name, time_limit=5.0)
        validate(problem, result)
        assert result.height == 5 and result.optimal, name
    fitted = plan(problem, capacity=5, time_limit=5.0)
    assert fitted.height == 5
    with pytest.raises(PlanDoesNotFitError) as info:
        plan(problem, capacity=4, time_limit=5.0)
    assert info.value.proven


@settings(max_examples=60, deadline=None, derandomize=True)
@given(spans=st.lists(st.tuples(st.integers(-5, 9), st.integers(1, 6)), max_size=15))
def test_overlapping_pairs_counts_like_brute_force(spans: list[tuple[int, int]]) -> None:
    problem = Problem(Buffer(f"b{i}", s, s + n, 1) for i, (s, n) in enumerate(spans))
    brute = sum(a.overlaps_in_time(b) for a in problem.buffers for b in problem.buffers)
    assert overlapping_pairs(problem) == brute


def test_auto_skips_an_exact_search_too_big_for_its_time_limit(
    spy_exact: Calls, no_peak_stack: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(staged_search, "_AUTO_EXACT_PAIRS_PER_SECOND", 1)
    result = plan(tight(), time_limit=2.0)
    assert spy_exact == []
    assert result.height == heuristics.portfolio(tight()).height
    assert result.statistics is not None
    assert result.statistics.exact_skipped and result.statistics.nodes == 0
    # exact is the planner to ask when the answer matters more than the time: it searches.
    by_name = plan(tight(), "exact", time_limit=2.0)
    assert len(spy_exact) == 1 and by_name.optimal and by_name.height == 5
    assert by_name.statistics is not None and not by_name.statistics.exact_skipped


@pytest.mark.parametrize("planner", ["greedy_size", "portfolio", "long_lived_first"])
def test_solver_params_for_a_planner_without_the_exact_search_are_refused(planner: str) -> None:
    from tensorarena.planning import SolverParams

    problem = Problem([Buffer("a", 0, 2, 32), Buffer("b", 1, 3, 32)])
    # They were ignored: a benchmark of --nocheck_dominance with --planner portfolio measured
    # nothing.
    with pytest.raises(InvalidArgumentError, match="runs no exact search"):
        plan(problem, planner, params=SolverParams(check_dominance=False))
    for searching in ("auto", "exact"):
        validate(problem, plan(problem, searching, params=SolverParams(check_dominance=False)))
