"""plan() and the registry of named planners: names, capacity, alignment, auto's contract."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorarena.errors import InfeasibleError, InvalidAlignmentError, InvalidSizeError
from tensorarena.planning import heuristics, planners
from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.planners import (
    PLANNERS,
    PlanDoesNotFitError,
    UnknownPlannerError,
    overlapping_pairs,
    plan,
)
from tensorarena.planning.problem import Buffer, Plan, Problem, lower_bound
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"
HEURISTIC_NAMES = sorted(heuristics.HEURISTICS)


def tight() -> Problem:
    """A problem every greedy misses (they need 6): its optimum is the lower bound, 5."""
    return Problem(
        [Buffer("a", 1, 3, 3), Buffer("b", 1, 4, 2), Buffer("c", 3, 6, 1), Buffer("d", 4, 5, 3)]
    )


@pytest.fixture
def fake_exact(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Install a stand-in ``tensorarena.planning.exact`` that records its calls and answers
    with a valid plan at the lower bound of :func:`tight`."""
    calls: list[dict[str, Any]] = []

    class Result:  # the shape of planning/exact.py's ExactResult
        def __init__(self, plan: Plan | None, proven: bool) -> None:
            self.plan = plan
            self.feasible = plan is not None
            self.proven = proven
            self.nodes = 1
            self.seconds = 0.0

    def solve_exact(problem: Problem, *, capacity: int | None = None,
                    time_limit: float = 10.0, initial: Plan | None = None) -> Result:
        calls.append(
            {"problem": problem, "capacity": capacity, "time_limit": time_limit,
             "initial": initial}
        )
        if capacity is not None and capacity < 5:
            return Result(None, True)  # proven: nothing fits below the lower bound
        if problem != tight():
            return Result(None, False)
        offsets = {"a": 0, "b": 3, "c": 0, "d": 1}
        # The decision version stops at the first plan that fits: it proves nothing more.
        found = Plan(problem, tuple(offsets[b.id] for b in problem.buffers),
                     planner="exact", optimal=capacity is None)
        return Result(found, True)

    monkeypatch.setattr(planners, "solve_exact", solve_exact)
    yield calls


def test_registry_names_every_planner() -> None:
    assert set(PLANNERS) == {"auto", "exact", *heuristics.HEURISTICS}
    for name in PLANNERS:
        assert PLANNERS[name].__doc__


@pytest.mark.parametrize("name", HEURISTIC_NAMES)
def test_named_heuristics_through_plan(name: str) -> None:
    problem = read_problem(DATA / "pisarchyk_lee.csv")
    result = plan(problem, name)
    validate(problem, result)
    assert result.stats["lower_bound"] == 124
    assert result.stats["seconds"] >= 0
    assert result.planner.startswith(name)


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


def test_auto_stops_at_the_lower_bound_without_searching(fake_exact: list[dict[str, Any]]) -> None:
    problem = read_problem(DATA / "pisarchyk_lee.csv")
    result = plan(problem)
    assert result.height == 124 and result.optimal
    assert result.planner.startswith("auto:portfolio:")
    assert fake_exact == []


def test_auto_runs_exact_seeded_with_the_portfolio(fake_exact: list[dict[str, Any]]) -> None:
    problem = tight()
    portfolio = heuristics.portfolio(problem)
    assert portfolio.height > lower_bound(problem) == 5
    result = plan(problem, time_limit=2.0)
    validate(problem, result)
    assert result.height == 5 and result.optimal
    assert result.planner == "auto:exact"
    (call,) = fake_exact
    assert call["initial"].offsets == portfolio.offsets
    assert 0 < call["time_limit"] <= 2.0


def test_auto_keeps_the_portfolio_when_exact_finds_nothing(
    fake_exact: list[dict[str, Any]],
) -> None:
    problem = Problem([*tight().buffers, Buffer("e", 0, 4, 0)])
    result = plan(problem, time_limit=0.1)
    assert result.height == heuristics.portfolio(problem).height
    assert result.planner.startswith("auto:portfolio:")
    assert len(fake_exact) == 1


def test_auto_reports_proven_infeasibility(fake_exact: list[dict[str, Any]]) -> None:
    with pytest.raises(PlanDoesNotFitError) as info:
        plan(tight(), capacity=4)
    assert info.value.proven
    assert fake_exact[0]["capacity"] == 4
    validate(tight(), info.value.plan)


def test_auto_minimises_when_the_portfolio_already_fits(
    fake_exact: list[dict[str, Any]],
) -> None:
    result = plan(tight(), capacity=100)
    assert result.height == 5
    assert fake_exact[0]["capacity"] is None


def test_auto_lowers_a_decision_answer_with_the_time_left(
    fake_exact: list[dict[str, Any]],
) -> None:
    result = plan(tight(), capacity=5, time_limit=5.0)
    assert result.height == 5 and result.optimal
    assert [call["capacity"] for call in fake_exact] == [5, None]
    assert fake_exact[1]["initial"].height == 5


def test_exact_planner_with_alignment(fake_exact: list[dict[str, Any]]) -> None:
    problem = tight()
    result = plan(problem, "exact", alignment=8)
    validate(problem.with_alignment(8), result)
    assert result.problem is problem
    (call,) = fake_exact
    assert call["problem"] == problem.with_alignment(8)
    assert call["initial"].problem == problem.with_alignment(8)
    assert result.height == heuristics.portfolio(problem, alignment=8).height


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
    with pytest.raises(UnknownPlannerError, match="unknown planner 'nope'"):
        plan(problem, "nope")
    with pytest.raises(InvalidAlignmentError):
        plan(problem, "naive", alignment=12)
    with pytest.raises(InvalidSizeError):
        plan(problem, "naive", capacity=-1)
    with pytest.raises(ValueError, match="time_limit"):
        plan(problem, "naive", time_limit=-1)


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
    fake_exact: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import tensorarena.planning.planners as planners

    monkeypatch.setattr(planners, "_AUTO_EXACT_PAIRS_PER_SECOND", 1)
    result = plan(tight(), time_limit=2.0)
    assert fake_exact == []
    assert result.height == heuristics.portfolio(tight()).height
    assert result.stats["exact_skipped"] == 1.0
    by_name = plan(tight(), "exact", time_limit=2.0)
    assert fake_exact == [] and by_name.stats["exact_skipped"] == 1.0
