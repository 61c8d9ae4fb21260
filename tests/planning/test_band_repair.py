"""Band repair: the hole at the peak cut out as a band, then exact searches in byte bands that free
long-lived buffers no time window can, on a work budget; only strictly lower, validated plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from instances import BUDGETED

import tensorarena.cli.main as cli_main
from tensorarena.errors import InvalidArgumentError, InvalidPlanError
from tensorarena.planning.band_repair import band_repair
from tensorarena.planning.budget import StopReason
from tensorarena.planning.csv_io import write_problem
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.planners import plan
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.repair import repair
from tensorarena.planning.validate import validate

# A band-shaped hole. ``top`` (ticks 500-501) sits at 18..22 because ``late`` (born at 501) cuts
# the 4-byte hole under ``long`` in two; the bound, 20, is reached at tick 0 (``base`` + ``peak``)
# and at tick 501. ``long`` and ``late`` live hundreds of ticks: they cross every window's edges,
# so windowed repair keeps them pinned and cannot lower the plan. The band [10, 20), long in
# time, frees ``long``, ``late`` and ``top`` together, and they fill it exactly (4 + 2 + 4).
BAND = Problem([Buffer("base", 0, 3000, 10), Buffer("peak", 0, 1, 10),
                Buffer("long", 100, 1000, 4), Buffer("late", 501, 1000, 2),
                Buffer("top", 500, 502, 4)])
BAND_PLAN = Plan(BAND, (0, 10, 14, 10, 18), planner="given")  # height 22
#: The work units the band step spends on BAND_PLAN (the same on any machine).
BAND_WORK_USED = 62


def test_windowed_repair_cannot_lower_the_band_shaped_hole() -> None:
    result = repair(BAND, BAND_PLAN)
    assert result.plan is BAND_PLAN
    assert (result.improved, result.stopped_by) == (0, StopReason.COMPLETE)


def test_band_repair_frees_the_long_lived_buffers_in_a_band_that_fits_exactly() -> None:
    result = band_repair(BAND, BAND_PLAN)
    validate(BAND, result.plan)
    assert BAND_PLAN.height == 22 and result.plan.height == 20 == BAND.lower_bound()
    assert result.stopped_by is StopReason.PROVEN
    assert result.plan.planner == "band_repair:given"
    # long, late and top fill [10, 20) exactly; base and peak did not move.
    offsets = dict(zip((b.id for b in BAND.buffers), result.plan.offsets, strict=True))
    assert (offsets["base"], offsets["peak"]) == (0, 10)
    assert sorted((offsets[k], offsets[k] + b) for k, b in (("long", 4), ("late", 2),
                                                            ("top", 4))) == [(10, 14), (14, 16),
                                                                             (16, 20)]
    assert (result.improved, result.windows) == (1, 2)  # [10, 14) proven empty, then [10, 20)
    assert result.work == BAND_WORK_USED and result.nodes > 0


def test_band_repair_gives_the_same_answer_and_work_every_time() -> None:
    first, second = band_repair(BAND, BAND_PLAN), band_repair(BAND, BAND_PLAN)
    assert first.plan.offsets == second.plan.offsets
    assert (first.nodes, first.work, first.windows) == (second.nodes, second.work,
                                                        second.windows)


@pytest.mark.parametrize("limit", [0, 1, 7, 20, 40, BAND_WORK_USED - 1])
def test_a_budget_that_runs_out_in_the_middle_leaves_the_plan_unchanged(limit: int) -> None:
    result = band_repair(BAND, BAND_PLAN, work_limit=limit)
    validate(BAND, result.plan)
    assert result.plan is BAND_PLAN  # the cut's plan is no lower: not kept
    assert result.stopped_by is StopReason.BUDGET
    # Each charge (a scan for holes, a band's set-up) is made whole before it is spent.
    assert result.work < BAND_WORK_USED and (limit == 0 or result.work > 0)
    assert band_repair(BAND, BAND_PLAN, work_limit=BAND_WORK_USED).plan.height == 20


def test_a_plan_at_its_optimum_above_the_bound_is_kept() -> None:
    # BUDGETED's optimum is 37 against a bound of 33: nothing lower exists to find.
    optimum = solve_exact(BUDGETED, node_limit=None).plan
    assert optimum is not None and optimum.height == 37
    result = band_repair(BUDGETED, optimum)
    assert result.plan is optimum and result.improved == 0
    assert result.stopped_by in (StopReason.COMPLETE, StopReason.BUDGET)


def test_the_cut_takes_the_lowest_of_equal_holes_and_keeps_only_a_lower_plan() -> None:
    # Three buffers of one tick with two 2-byte holes between them: the lower hole is cut
    # (b and c move down by 2), and the cut's plan, lower, is kept even with no search budget.
    steps = Problem([Buffer("a", 0, 1, 2), Buffer("b", 0, 1, 2), Buffer("c", 0, 1, 2)])
    start = Plan(steps, (0, 4, 8))
    cut = band_repair(steps, start, work_limit=0)
    assert cut.plan.offsets == (0, 2, 6) and cut.stopped_by is StopReason.BUDGET
    full = band_repair(steps, start)
    assert full.plan.height == 6 and full.stopped_by is StopReason.PROVEN


def test_band_repair_respects_a_raised_alignment() -> None:
    start = Plan(BAND, (0, 16, 16, 24, 32))  # every offset a multiple of 8: height 36
    result = band_repair(BAND, start, alignment=8)
    aligned = BAND.with_alignment(8)
    validate(aligned, Plan(aligned, result.plan.offsets))
    assert result.plan.height == 34 and result.stopped_by is StopReason.PROVEN


def test_band_repair_moves_no_pin() -> None:
    pinned = Problem([*BAND.buffers[:2], Buffer("long", 100, 1000, 4, offset=14),
                      *BAND.buffers[3:]])
    result = band_repair(pinned, Plan(pinned, BAND_PLAN.offsets))
    validate(pinned, result.plan)
    # long stays at 14; top takes [10, 14) and late goes above long, [18, 20).
    assert result.plan.offset_of("long") == 14
    assert (result.plan.offset_of("top"), result.plan.offset_of("late")) == (10, 18)
    assert result.plan.height == 20


def test_band_repair_stops_at_the_gap_and_the_clock() -> None:
    assert band_repair(BAND, BAND_PLAN, gap=0.1).stopped_by is StopReason.GOOD_ENOUGH
    timed = band_repair(BAND, BAND_PLAN, time_limit=0.0)
    assert timed.plan is BAND_PLAN and timed.stopped_by is StopReason.TIME_LIMIT


def test_band_repair_refuses_bad_arguments_and_plans() -> None:
    with pytest.raises(InvalidArgumentError, match="work_limit"):
        band_repair(BAND, BAND_PLAN, work_limit=-1)
    with pytest.raises(InvalidArgumentError, match="gap"):
        band_repair(BAND, BAND_PLAN, gap=-1.0)
    with pytest.raises(InvalidPlanError):
        band_repair(BAND, Plan(BAND, (0, 0, 0, 0, 0)))


def test_plan_with_repair_runs_the_band_step_and_counts_its_work() -> None:
    plain = plan(BAND, "naive")
    repaired = plan(BAND, "naive", repair=True)
    validate(BAND, repaired)
    assert plain.height == 30 and repaired.height == 20 and repaired.optimal
    assert repaired.planner == "band_repair:naive"
    band = band_repair(BAND, plain, gap=1e-4)
    assert plain.statistics is not None and repaired.statistics is not None
    assert repaired.statistics.work == plain.statistics.work + band.work
    assert repaired.statistics.stopped_by is StopReason.PROVEN


def test_the_cli_reaches_the_band_step(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "band.csv"
    write_problem(BAND, path)
    status = cli_main.main(["plan", str(path), "--planner", "naive", "--repair", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert (status, summary["height"], summary["planner"]) == (0, 20, "band_repair:naive")


def test_free_zero_byte_buffers_go_to_zero_where_no_buffer_can_straddle_them() -> None:
    points = Problem([*BAND.buffers, Buffer("point", 500, 600, 0)])
    result = band_repair(points, Plan(points, (*BAND_PLAN.offsets, 12)))
    validate(points, result.plan)
    assert result.plan.height == 20 and result.plan.offset_of("point") == 0


# TIGHT (greedy 6, optimum = bound 5) beside ten buffers far away in time: 14 buffers.
WIDE = Problem([Buffer("a", 1, 3, 3), Buffer("b", 1, 4, 2), Buffer("c", 3, 6, 1),
                Buffer("d", 4, 5, 3), *(Buffer(f"f{k}", 100 + k, 101 + k, 5) for k in range(10))])


def test_auto_runs_the_band_step_when_its_search_could_not_place_every_buffer_once() -> None:
    stages: list[str] = []
    banded = plan(WIDE, "auto", node_limit=13, work_limit=None, progress=lambda p:
                  stages.append(p.stage))
    validate(WIDE, banded)
    assert "band_repair" in stages and "exact" not in stages  # at the bound: no search left
    assert banded.height == 5 and banded.planner.startswith("auto:band_repair:")
    assert banded.statistics is not None and 0 < banded.statistics.nodes <= 13
    # 14 nodes: one per buffer, a dive fits: the search runs as before, no band step.
    stages.clear()
    searched = plan(WIDE, "auto", node_limit=14, work_limit=None, progress=lambda p:
                    stages.append(p.stage))
    assert "band_repair" not in stages and "exact" in stages
    assert searched.statistics is not None and searched.statistics.nodes == 14
    # The band step spends no more than the plan's budgets: 3 nodes cannot lower TIGHT (the
    # peak stack, after the search and on no nodes, then does).
    starved = plan(WIDE, "auto", node_limit=3, work_limit=None)
    assert starved.statistics is not None and starved.statistics.nodes <= 3
    assert starved.planner.startswith("auto:peak_stack:portfolio:")  # not the band step's


def test_the_windows_still_run_after_a_band_step_that_lowers_nothing() -> None:
    # greedy_size leaves this at 9 (bound 8): no band lowers it, the windows do.
    small = Problem([Buffer("a", 2, 4, 2), Buffer("b", 1, 2, 3), Buffer("c", 3, 5, 2),
                     Buffer("d", 4, 5, 3), Buffer("e", 0, 4, 2), Buffer("f", 1, 5, 2)])
    plain = plan(small, "greedy_size")
    band = band_repair(small, plain, gap=1e-4)
    assert plain.height == 9 and band.plan is plain
    repaired = plan(small, "greedy_size", repair=True)
    validate(small, repaired)
    assert repaired.height == 8 and repaired.planner == "windowed_repair:greedy_size"
    windows = repair(small, plain)
    assert plain.statistics is not None and repaired.statistics is not None
    assert repaired.statistics.work == plain.statistics.work + band.work + windows.work


@pytest.mark.parametrize("seed", range(40))
def test_random_plans_come_back_valid_and_never_higher(seed: int) -> None:
    import random

    from tensorarena.planning.heuristics import greedy_size

    rng = random.Random(seed)
    buffers = []
    for k in range(rng.randint(3, 12)):
        start = rng.randrange(8)
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(1, 5), rng.randint(0, 6),
                              rng.choice((1, 1, 2, 4))))
    if seed % 3 == 0:  # one pinned buffer, at the bottom of every other one
        buffers[0] = Buffer("pin", 0, 20, 2, offset=0)
    problem = Problem(buffers)
    alignment = 4 if seed % 5 == 0 else None
    start = greedy_size(problem, alignment=alignment)
    result = band_repair(problem, start, alignment=alignment)
    checked = problem if alignment is None else problem.with_alignment(alignment)
    validate(checked, Plan(checked, result.plan.offsets))
    # The plan in hand, or a strictly lower one: never another plan of the same height.
    assert result.plan is start or result.plan.height < start.height
    for buffer, offset in zip(problem.buffers, result.plan.offsets, strict=True):
        assert buffer.offset is None or offset == buffer.offset
