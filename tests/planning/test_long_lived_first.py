"""The long-lived-first orders: where greedy by size stays above the optimum and they reach it.

Every plan goes through the independent validator.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import heuristics, staged_search
from tensorarena.planning import long_lived_first as llf
from tensorarena.planning.budget import StopReason
from tensorarena.planning.exact import ExactResult, solve_exact
from tensorarena.planning.heuristics import PlacementArrays
from tensorarena.planning.long_lived_first import FRACTIONS, long_lived_first, long_lived_order
from tensorarena.planning.peak_stack import PeakStackResult
from tensorarena.planning.planners import plan
from tensorarena.planning.problem import Buffer, Problem, lower_bound
from tensorarena.planning.validate import validate


def stack() -> Problem:
    """Four 2-byte buffers born in sequence and a 3-byte one: the optimum is the bound, 8.

    Greedy by size takes the equal buffers longest first (a, b, c, d), which leaves d's 2 bytes
    no gap below c during [3, 5): every heuristic needs 9 or more. By birth (a, b, d,
    c) they stack, and e fits beside them.
    """
    return Problem([Buffer("a", 1, 6, 2), Buffer("b", 2, 5, 2), Buffer("c", 4, 7, 2),
                    Buffer("d", 3, 5, 2), Buffer("e", 5, 6, 3)])


def test_reaches_the_bound_where_every_heuristic_stays_above() -> None:
    problem = stack()
    assert lower_bound(problem) == 8
    for name, heuristic in heuristics.HEURISTICS.items():
        assert heuristic(problem).height >= 9, name
    result = long_lived_first(problem)
    validate(problem, result)
    assert result.height == 8 and result.optimal
    assert result.planner.startswith("long_lived_first:")


def test_auto_reaches_it_through_its_stage_without_the_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[ExactResult] = []

    def starved(problem: Problem, **kwargs: Any) -> ExactResult:
        calls.append(solve_exact(problem, **{**kwargs, "node_limit": 0}))
        return calls[-1]

    monkeypatch.setattr(staged_search, "solve_exact", starved)
    problem = stack()
    result = plan(problem, time_limit=5.0)
    validate(problem, result)
    assert result.height == 8 and result.optimal
    assert result.planner.startswith("auto:long_lived_first:")
    assert calls == []  # at the bound: the search never ran
    # Without the stage (and the peak stack after the search) the starved search keeps the
    # portfolio's 9.
    monkeypatch.setattr(staged_search, "long_lived_first_planner", lambda p, o, **kw: kw["initial"])
    monkeypatch.setattr(staged_search, "peak_stack", lambda p, given, **kw: PeakStackResult(
        given, "", 0, 0, StopReason.COMPLETE))
    assert plan(problem, time_limit=5.0).height == 9


def test_the_order_stacks_long_lived_buffers_by_birth_then_the_rest_by_size() -> None:
    problem = Problem([
        Buffer("short_big", 4, 5, 9), Buffer("long_late", 3, 10, 1), Buffer("long_early", 0, 8, 2),
        Buffer("short_small_late", 6, 7, 3), Buffer("short_small_early", 1, 2, 3),
        Buffer("long_same_birth", 0, 9, 1),
    ])
    arrays = PlacementArrays(problem, None)
    ids = [problem.buffers[i].id for i in long_lived_order(arrays, 0.5).tolist()]
    assert ids == ["long_same_birth", "long_early", "long_late", "short_big",
                   "short_small_early", "short_small_late"]
    everything = [problem.buffers[i].id for i in long_lived_order(arrays, 0.0).tolist()]
    assert everything[:3] == ["long_same_birth", "long_early", "short_small_early"]


def test_keeps_the_initial_plan_unless_an_order_beats_it() -> None:
    problem = stack()
    optimum = long_lived_first(problem)
    assert long_lived_first(problem, initial=optimum) is optimum
    worse = heuristics.portfolio(problem)
    assert long_lived_first(problem, initial=worse).height == 8


def test_stops_at_the_gap_and_after_one_placement_out_of_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placed: list[int] = []
    real = heuristics.place

    def counting(*args: Any, **kwargs: Any) -> Any:
        placed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(llf, "place", counting)
    problem = stack()
    long_lived_first(problem, time_limit=0.0)
    assert len(placed) == 1  # the first placement always runs, then the clock says stop
    placed.clear()
    long_lived_first(problem, gap=0.2)  # 9 is within 20 % of 8: the first order is enough
    assert len(placed) == 1
    placed.clear()
    long_lived_first(problem, target=100)
    assert len(placed) == 1
    placed.clear()
    long_lived_first(problem, gap=0.0)
    assert 1 < len(placed) <= len(FRACTIONS)


@pytest.mark.parametrize("alignment", [None, 16])
def test_every_plan_is_valid_on_random_problems(alignment: int | None) -> None:
    rng = random.Random(9)
    for _ in range(60):
        buffers = []
        for i in range(rng.randint(0, 25)):
            start = rng.randint(0, 20)
            buffers.append(Buffer(f"b{i}", start, start + rng.randint(1, 12), rng.randint(0, 40),
                                  rng.choice([1, 1, 8])))
        problem = Problem(buffers)
        result = long_lived_first(problem, alignment=alignment)
        validate(problem if alignment is None else problem.with_alignment(alignment), result)
        assert result.height >= lower_bound(problem)
        through_plan = plan(problem, "long_lived_first", alignment=alignment)
        assert through_plan.offsets == result.offsets


def test_auto_reports_the_stage_in_its_progress() -> None:
    seen: list[tuple[str, int | None]] = []
    result = plan(stack(), time_limit=5.0, progress=lambda p: seen.append((p.stage, p.height)))
    stages = [stage for stage, _ in seen]
    assert stages[0] == "heuristics" and stages[-1] == "done"
    assert ("long_lived_first", 8) in seen
    assert result.height == 8


def test_an_initial_plan_of_another_problem_or_not_a_plan_is_refused() -> None:
    problem = stack()
    other = Problem([Buffer("z", 0, 1, 8)])
    # 8 bytes high, below any plan of the stack: it was returned as the stack's plan.
    with pytest.raises(InvalidArgumentError, match="initial must be a Plan of this problem"):
        long_lived_first(problem, initial=plan(other))
    with pytest.raises(InvalidArgumentError, match="initial must be a Plan"):
        long_lived_first(problem, initial="plan")  # type: ignore[arg-type]  # AttributeError
    same = Problem(list(problem.buffers), name=problem.name)  # equal, not the same object
    validate(problem, long_lived_first(problem, initial=plan(same)))
