"""Work units of the exact search: a node weighed by its problem's size, and the budget in them.

A work budget is a node budget scaled by the problem at the start, so it stops the search at
the same node on any machine, under any clock, in either engine; no test here is timed.
"""

from __future__ import annotations

import math

import pytest
from instances import BUDGETED

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import StopReason, exact_work, plan, solve_exact
from tensorarena.planning.exact_params import Status
from tensorarena.planning.exact_search import ENGINES, Solver
from tensorarena.planning.exact_sections import build_sections
from tensorarena.planning.exact_work import SCATTERED_WEIGHT, node_budget, node_work
from tensorarena.planning.problem import Buffer, Problem

SECTIONS = build_sections(BUDGETED.buffers)
UNIT = node_work(SECTIONS)


def _proof_at_36() -> int:
    """Nodes the decision search needs to prove that nothing fits 36 bytes (optimum: 37)."""
    found = Solver().solve(SECTIONS, 36)
    assert found.status is Status.EXHAUSTED
    return found.nodes


def test_a_node_costs_its_buffers_plus_their_time_sections() -> None:
    # Times 0-4: a spans sections [0,1) [1,2), b [1,2) [2,3), c [2,3) [3,4): six pairs.
    problem = Problem([Buffer("a", 0, 2, 8), Buffer("b", 1, 3, 8), Buffer("c", 2, 4, 8)])
    sections = build_sections(problem.buffers)
    assert int((sections.last - sections.first).sum()) == 6
    assert node_work(sections) == 3 + 6


def test_the_scattered_floor_weighs_its_pairs_past_the_table_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = UNIT - len(SECTIONS)
    monkeypatch.setattr(exact_work, "MEMBERS_LIMIT", pairs)  # the table still fits: exact fit
    assert node_work(SECTIONS) == len(SECTIONS) + pairs
    monkeypatch.setattr(exact_work, "MEMBERS_LIMIT", pairs - 1)  # one pair too many: a scatter
    assert node_work(SECTIONS) == len(SECTIONS) + SCATTERED_WEIGHT * pairs


def test_the_tighter_budget_wins() -> None:
    assert node_budget(None, None, SECTIONS) is None
    assert node_budget(7, None, SECTIONS) == 7
    assert node_budget(None, 5 * UNIT + UNIT - 1, SECTIONS) == 5
    assert node_budget(4, 5 * UNIT, SECTIONS) == 4
    assert node_budget(9, 5 * UNIT, SECTIONS) == 5


@pytest.mark.parametrize("engine", ENGINES)
def test_exactly_the_work_a_proof_needs_proves_it_and_one_unit_less_stops(engine: str) -> None:
    needed = _proof_at_36()
    solver = Solver(engine=engine)
    done = solver.solve(SECTIONS, 36, work_limit=needed * UNIT)
    assert (done.status, done.nodes) == (Status.EXHAUSTED, needed)
    short = solver.solve(SECTIONS, 36, work_limit=needed * UNIT - 1)
    assert (short.status, short.nodes, short.timed_out) == (Status.STOPPED, needed - 1, False)


def test_solve_exact_reports_the_work_used_and_which_budget_ended_it() -> None:
    needed = _proof_at_36()
    done = solve_exact(BUDGETED, capacity=36, work_limit=needed * UNIT)
    assert (done.proven, done.feasible, done.stopped_by) == (True, False, StopReason.PROVEN)
    assert (done.nodes, done.work, done.work_limit) == (needed, needed * UNIT, needed * UNIT)
    short = solve_exact(BUDGETED, capacity=36, work_limit=needed * UNIT - 1)
    assert (short.proven, short.stopped_by) == (False, StopReason.BUDGET)
    assert (short.nodes, short.work) == (needed - 1, (needed - 1) * UNIT)
    assert short.node_limit is not None and short.node_limit > needed  # the work budget bound


def test_a_work_budget_gives_the_same_plan_under_any_time_limit_that_does_not_bind() -> None:
    runs = [plan(BUDGETED, "exact", gap=0, work_limit=200 * UNIT, time_limit=limit)
            for limit in (60.0, math.inf)]
    first, second = (run.statistics for run in runs)
    assert first is not None and second is not None
    assert first.stopped_by is StopReason.BUDGET
    assert (first.nodes, first.work, first.work_limit) == (200, 200 * UNIT, 200 * UNIT)
    assert (second.nodes, second.work, second.stopped_by) == (200, 200 * UNIT, StopReason.BUDGET)
    assert runs[0].offsets == runs[1].offsets


def test_a_bad_work_limit_is_refused() -> None:
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(InvalidArgumentError, match="work_limit"):
            solve_exact(BUDGETED, work_limit=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="work_limit"):
            plan(BUDGETED, "exact", work_limit=bad)  # type: ignore[arg-type]


def test_the_node_work_of_a_problem_is_that_of_its_sections_without_building_them() -> None:
    from tensorarena.planning.exact_work import can_dive, problem_node_work

    problem = Problem([Buffer("a", 0, 2, 8), Buffer("b", 1, 3, 8), Buffer("c", 2, 4, 8),
                       Buffer("empty", 0, 9, 0)])
    assert problem_node_work(problem) == node_work(build_sections(problem.buffers)) == 9
    assert problem_node_work(BUDGETED) == UNIT
    # A dive places each of the 3 non-empty buffers once: 3 nodes, or 27 work units.
    assert can_dive(problem, 3, None) and not can_dive(problem, 2, None)
    assert can_dive(problem, None, 27) and not can_dive(problem, None, 26)
    assert can_dive(problem, None, None)
