"""Windowed repair: an exact search over the window around a plan's top, with the buffers that
cross the window's edges pinned, keeps only strictly lower plans that validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from instances import BUDGETED

import tensorarena.cli.main as cli_main
from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import planners
from tensorarena.planning.band_repair import band_repair
from tensorarena.planning.bounds import DEFAULT_GAP
from tensorarena.planning.budget import StopReason
from tensorarena.planning.csv_io import write_problem
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.planners import plan
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.repair import repair
from tensorarena.planning.validate import validate

# ``long`` crosses the window [1, 2) around ``top``: pinned at 4, it leaves [0, 4) free there.
HOLE = Problem([Buffer("long", 0, 4, 4), Buffer("top", 1, 2, 4), Buffer("late", 3, 4, 4)])
HOLE_PLAN = Plan(HOLE, (4, 8, 0))  # height 12, the bound is 8


def test_repair_drops_the_top_into_the_hole_below_a_pinned_crosser() -> None:
    result = repair(HOLE, HOLE_PLAN)
    validate(HOLE, result.plan)
    assert result.plan.height == 8
    assert result.plan.offset_of("long") == 4  # crossing the window: kept where it was
    assert result.plan.offset_of("top") == 0
    assert result.plan.planner == "windowed_repair:"
    assert (result.windows, result.improved) == (1, 1)
    assert result.nodes > 0


def test_repair_keeps_the_plan_when_nothing_lower_exists() -> None:
    # ``wall`` lives through the window and sits under the top at 0..4; the bound is 12.
    problem = Problem([Buffer("wall", 0, 4, 4), Buffer("long", 0, 4, 4), Buffer("top", 1, 2, 4)])
    start = Plan(problem, (0, 4, 8), planner="given")
    result = repair(problem, start)
    assert result.plan is start
    assert result.improved == 0


def test_repair_moves_no_pin_and_no_buffer_outside_the_window() -> None:
    problem = Problem([Buffer("pin", 0, 4, 4, offset=0), Buffer("long", 0, 4, 4),
                       Buffer("top", 1, 2, 4), Buffer("far", 6, 8, 4)])
    start = Plan(problem, (0, 4, 8, 4))
    result = repair(problem, start)
    validate(problem, result.plan)
    assert result.plan.offsets == start.offsets  # the pin fills the only hole: no lower plan
    # Without the pin the repair could only move ``top``: ``far`` is outside every window.
    free = Problem([Buffer("a", 0, 4, 4), Buffer("long", 0, 4, 4), Buffer("top", 1, 2, 4),
                    Buffer("far", 6, 8, 4)])
    moved = repair(free, Plan(free, (8, 4, 12, 4))).plan
    assert moved.height < 16 and moved.offset_of("far") == 4 and moved.offset_of("long") == 4


def test_repair_with_no_nodes_changes_nothing() -> None:
    result = repair(HOLE, HOLE_PLAN, node_limit=0)
    assert result.plan is HOLE_PLAN and result.nodes == 0


def test_repair_respects_a_raised_alignment() -> None:
    aligned = HOLE.with_alignment(8)
    result = repair(HOLE, Plan(HOLE, (8, 16, 0)), alignment=8)
    validate(aligned, Plan(aligned, result.plan.offsets))
    assert result.plan.offsets == (8, 0, 0)


def test_auto_leaves_repair_to_the_caller() -> None:
    # Windowed repair lowered none of the large traces it was wired into auto for, at ~17 s on
    # pangu_2.6B: auto no longer runs it, and a caller who wants it calls repair() on a plan.
    stages: list[str] = []
    # A problem every greedy misses (they need 6; the optimum is its bound, 5).
    tight = Problem([Buffer("a", 1, 3, 3), Buffer("b", 1, 4, 2), Buffer("c", 3, 6, 1),
                     Buffer("d", 4, 5, 3)])
    greedy = plan(tight, "greedy_size")
    assert greedy.height == 6
    assert plan(tight, "auto", progress=lambda p: stages.append(p.stage)).height == 5
    assert "exact" in stages and "windowed_repair" not in stages
    assert not hasattr(planners, "repair")
    repaired = repair(tight, greedy)
    validate(tight, repaired.plan)
    assert repaired.plan.height == 5


TIGHT = Problem([Buffer("a", 1, 3, 3), Buffer("b", 1, 4, 2), Buffer("c", 3, 6, 1),
                 Buffer("d", 4, 5, 3)])


def test_plan_repairs_any_planners_plan_when_asked() -> None:
    plain = plan(TIGHT, "greedy_size")
    assert plain.height == 6 and plain.statistics is not None
    repaired = plan(TIGHT, "greedy_size", repair=True)
    validate(TIGHT, repaired)
    assert repaired.height == 5 and repaired.optimal  # at the bound
    # The band step runs first (band_repair.py) and reaches the bound: no window is searched.
    assert repaired.planner == "band_repair:greedy_size"
    assert repaired.statistics is not None and repaired.statistics.nodes > 0
    band = band_repair(TIGHT, plain, gap=DEFAULT_GAP)
    assert band.work >= band.nodes > 0  # the bands' nodes, each weighed by its size
    assert repaired.statistics.work == plain.statistics.work + band.work
    result = repair(TIGHT, plain)
    assert result.work >= result.nodes > 0  # the windows' nodes, each weighed by its size


def test_plan_with_repair_keeps_the_pins_and_a_capacity() -> None:
    pinned = Problem([*TIGHT.buffers[:3], Buffer("d", 4, 5, 3, offset=2)])
    repaired = plan(pinned, "greedy_size", capacity=6, repair=True)
    validate(pinned, repaired, capacity=6)
    assert repaired.offset_of("d") == 2


def test_plan_refuses_a_repair_that_is_not_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="repair must be a bool"):
        plan(TIGHT, repair="yes")  # type: ignore[arg-type]


def test_the_cli_repairs_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tight.csv"
    write_problem(TIGHT, path)
    for flags, height in (([], 6), (["--repair"], 5)):
        status = cli_main.main(["plan", str(path), "--planner", "greedy_size", "--json",
                                *flags])
        summary = json.loads(capsys.readouterr().out)
        assert (status, summary["height"]) == (0, height)


def test_repair_says_what_ended_it() -> None:
    assert repair(HOLE, HOLE_PLAN).stopped_by is StopReason.PROVEN  # at the bound
    assert repair(HOLE, HOLE_PLAN, node_limit=0).stopped_by is StopReason.BUDGET
    assert repair(HOLE, HOLE_PLAN, time_limit=0.0).stopped_by is StopReason.TIME_LIMIT
    # An optimum above the bound (37 against 33): every window tried, none lower.
    optimum = solve_exact(BUDGETED, node_limit=None).plan
    assert optimum is not None and optimum.height == 37
    kept = repair(BUDGETED, optimum)
    assert kept.plan is optimum
    assert kept.stopped_by is StopReason.COMPLETE and kept.windows > 0


def test_plan_with_repair_reports_a_repair_the_clock_ended() -> None:
    # No time left for the repair: the plan is the planner's, and says the clock ended it.
    result = plan(TIGHT, "greedy_size", repair=True, time_limit=0.0)
    assert result.height == 6
    assert result.statistics is not None
    assert result.statistics.stopped_by is StopReason.TIME_LIMIT
    repaired = plan(TIGHT, "greedy_size", repair=True)
    assert repaired.statistics is not None
    assert repaired.statistics.stopped_by is StopReason.PROVEN
