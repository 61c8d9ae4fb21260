"""The peak stack: the buffers live at the peak placed first, stacked with no hole there, the rest
best fit around them; only a strictly lower plan, validated, replaces the one given, and the work
budget is charged per whole placement."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tensorarena.errors import InvalidArgumentError, InvalidPlanError
from tensorarena.planning.budget import StopReason
from tensorarena.planning.heuristics import PlacementArrays, naive
from tensorarena.planning.long_lived_first import long_lived_first
from tensorarena.planning.peak_stack import (
    ORDERS,
    peak_crossers,
    peak_stack,
    peak_stacked_plan,
    placement_work,
)
from tensorarena.planning.problem import Buffer, Plan, PlanStatistics, Problem
from tensorarena.planning.validate import validate

# Peak [1, 3): x and y (8 bytes). z is born as x dies; given on top of both, it is 4 too high.
HOLE = Problem([Buffer("x", 0, 3, 4), Buffer("y", 1, 6, 4), Buffer("z", 3, 6, 4)])
HOLE_PLAN = Plan(HOLE, (0, 4, 8), planner="given")  # height 12, the bound is 8

# long_lived_first's plan leaves a hole at the peak here (9 bytes; the bound is 8).
LEFT_HOLE = Problem([Buffer("a", 1, 4, 1), Buffer("b", 3, 6, 2), Buffer("c", 5, 9, 4),
                     Buffer("d", 1, 6, 2), Buffer("e", 0, 3, 4)])

# No order reaches the bound (5): every one stops at 6.
ABOVE = Problem([Buffer("a", 1, 2, 4), Buffer("b", 0, 1, 2), Buffer("c", 1, 6, 1),
                 Buffer("d", 4, 8, 3), Buffer("e", 6, 9, 2)])


def _cost(problem: Problem) -> int:
    return placement_work(PlacementArrays(problem, None))


def _live_at(problem: Problem, plan: Plan, tick: int) -> list[tuple[int, int]]:
    return sorted((o, o + b.nbytes) for b, o in zip(problem.buffers, plan.offsets, strict=True)
                  if b.start <= tick < b.end)


def test_the_peak_tick_packs_exactly_and_the_plan_reaches_the_bound() -> None:
    result = peak_stack(HOLE, HOLE_PLAN)
    validate(HOLE, result.plan)
    assert result.plan.height == HOLE.lower_bound() == 8
    assert _live_at(HOLE, result.plan, 1) == [(0, 4), (4, 8)]  # stacked, no hole
    assert result.plan.offsets == (0, 4, 0)  # z takes x's bytes once x is dead
    assert (result.order, result.placements) == ("birth+size", 1)
    assert result.work == _cost(HOLE) == 6  # 3 buffers: 1 + 2 + 3
    assert result.stopped_by is StopReason.PROVEN
    assert result.plan.planner == "peak_stack:given" and result.plan.optimal


def test_it_closes_the_hole_long_lived_first_leaves_at_the_peak() -> None:
    start = long_lived_first(LEFT_HOLE)
    assert start.height == 9
    result = peak_stack(LEFT_HOLE, start)
    validate(LEFT_HOLE, result.plan)
    assert result.plan.height == LEFT_HOLE.lower_bound() == 8
    assert result.stopped_by is StopReason.PROVEN


def test_the_peak_is_the_first_section_with_the_most_live_bytes() -> None:
    arrays = PlacementArrays(HOLE, None)
    assert peak_crossers(arrays).tolist() == [0, 1]  # [1, 3) before the equal [3, 6)
    assert peak_crossers(PlacementArrays(Problem([]), None)).tolist() == []


def test_an_equal_height_keeps_the_plan_given() -> None:
    first = peak_stack(ABOVE, naive(ABOVE))
    assert first.plan.height == 6 > ABOVE.lower_bound()
    again = peak_stack(ABOVE, first.plan)
    assert again.plan is first.plan  # every order gives 6: not strictly lower
    assert again.order == ""
    assert again.placements == len(ORDERS)
    assert again.work == len(ORDERS) * _cost(ABOVE)
    assert again.stopped_by is StopReason.COMPLETE


def test_a_plan_at_the_bound_costs_nothing() -> None:
    best = peak_stack(HOLE, HOLE_PLAN).plan
    result = peak_stack(HOLE, best)
    assert result.plan is best
    assert (result.placements, result.work, result.stopped_by) == (0, 0, StopReason.PROVEN)
    empty = Problem([])
    assert peak_stack(empty, Plan(empty, ())).stopped_by is StopReason.PROVEN


def test_the_budget_is_charged_per_whole_placement() -> None:
    cost = _cost(ABOVE)
    start = naive(ABOVE)
    # One unit short of a placement: nothing is placed, the plan given comes back as it was.
    for limit in (0, cost - 1):
        result = peak_stack(ABOVE, start, work_limit=limit)
        assert result.plan is start
        assert (result.placements, result.work) == (0, 0)
        assert result.stopped_by is StopReason.BUDGET
    # Exactly one placement's charge, or one unit short of two: one order, then the budget.
    for limit in (cost, 2 * cost - 1):
        result = peak_stack(ABOVE, start, work_limit=limit)
        validate(ABOVE, result.plan)
        assert (result.placements, result.work) == (1, cost)
        assert result.plan.height == 6 and result.stopped_by is StopReason.BUDGET
    unlimited = peak_stack(ABOVE, start, work_limit=None)
    assert unlimited.placements == len(ORDERS)
    assert unlimited.stopped_by is StopReason.COMPLETE


def test_the_clock_is_an_outer_bound() -> None:
    result = peak_stack(HOLE, HOLE_PLAN, time_limit=0)
    assert result.plan is HOLE_PLAN
    assert (result.placements, result.stopped_by) == (0, StopReason.TIME_LIMIT)


def test_pins_and_alignment_hold() -> None:
    problem = Problem([Buffer("x", 0, 3, 4), Buffer("y", 1, 6, 4, offset=8),
                       Buffer("z", 3, 6, 4), Buffer("w", 0, 2, 3)])
    start = Plan(problem, (0, 8, 12, 4))
    result = peak_stack(problem, start, alignment=4)
    validate(problem, result.plan)
    assert result.plan.offset_of("y") == 8
    assert all(o % 4 == 0 for o in result.plan.offsets)
    assert result.plan.height <= start.height


def test_bad_input_raises_and_changes_nothing() -> None:
    clash = Plan(HOLE, (0, 0, 8))
    with pytest.raises(InvalidPlanError):
        peak_stack(HOLE, clash)
    with pytest.raises(InvalidArgumentError, match="work_limit"):
        peak_stack(HOLE, HOLE_PLAN, work_limit=-1)
    with pytest.raises(InvalidArgumentError, match="work_limit"):
        peak_stack(HOLE, HOLE_PLAN, work_limit=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="time_limit"):
        peak_stack(HOLE, HOLE_PLAN, time_limit=-1)
    with pytest.raises(InvalidArgumentError, match="Plan"):
        peak_stack(HOLE, (0, 4, 8))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="Problem"):
        peak_stack("HOLE", HOLE_PLAN)  # type: ignore[arg-type]
    assert HOLE_PLAN.offsets == (0, 4, 8)


def test_a_plan_above_the_capacity_may_come_down() -> None:
    problem = Problem(HOLE.buffers, capacity=8)
    result = peak_stack(problem, Plan(problem, (0, 4, 8)))
    validate(problem, result.plan)
    assert result.plan.height == 8


def test_statistics_count_the_work_and_the_proof() -> None:
    stats = PlanStatistics(seconds=0.5, lower_bound=8, nodes=7, work=100,
                           stopped_by=StopReason.BUDGET)
    start = replace(HOLE_PLAN, statistics=stats)
    found = peak_stacked_plan(HOLE, start)
    assert found.height == 8 and found.optimal
    assert found.statistics is not None
    assert (found.statistics.nodes, found.statistics.work) == (7, 106)
    assert found.statistics.stopped_by is StopReason.PROVEN
    bare = peak_stacked_plan(HOLE, HOLE_PLAN)
    assert bare.statistics is None and bare.height == 8


@pytest.mark.parametrize("seed", range(40))
def test_random_problems_never_worse_and_deterministic(seed: int) -> None:
    rng = random.Random(seed)
    buffers = []
    for i in range(rng.randint(1, 30)):
        start = rng.randint(0, 20)
        buffers.append(Buffer(f"b{i}", start, start + rng.randint(1, 12), rng.randint(0, 64)))
    problem = Problem(buffers)
    start_plan = naive(problem) if seed % 2 else long_lived_first(problem)
    result = peak_stack(problem, start_plan)
    validate(problem, result.plan)
    assert problem.lower_bound() <= result.plan.height <= start_plan.height
    assert (result.plan.height < start_plan.height) == (result.plan is not start_plan)
    assert peak_stack(problem, start_plan).plan.offsets == result.plan.offsets
