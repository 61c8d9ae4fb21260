"""The exact search's two engines (NumPy's node and the list node mypyc compiles) are one search.

Both must visit exactly the same nodes and return the same offsets, for every technique switched
on or off, at capacities that fit and capacities that do not, under node budgets that stop them
midway, with pinned buffers, and with the memories of failed states forced to start afresh. Run
on the pure build the list engine runs interpreted; on the compiled build, compiled: the same test
judges both.
"""

from __future__ import annotations

import random

import pytest
from instances import BUDGETED, aligned_instance

from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning import exact_node
from tensorarena.planning.exact import greedy_plan, solve_exact
from tensorarena.planning.exact_lists import compiled
from tensorarena.planning.exact_params import Decision, SolverParams, Status
from tensorarena.planning.exact_search import ENGINES, Solver
from tensorarena.planning.exact_sections import Sections, build_sections
from tensorarena.planning.exact_work import node_work
from tensorarena.planning.problem import Buffer, Plan, Problem, lower_bound
from tensorarena.planning.validate import validate

SWITCHES = SolverParams.switches()


def _both(sections: Sections, capacity: int, params: SolverParams | None = None,
          node_limit: int | None = None, work_limit: int | None = None
          ) -> tuple[Decision, Decision]:
    numpy, lists = (Solver(params, engine=engine).solve(sections, capacity, node_limit=node_limit,
                                                        work_limit=work_limit)
                    for engine in ENGINES)
    assert numpy.status is lists.status, capacity
    assert numpy.nodes == lists.nodes, capacity
    if numpy.offsets is None:
        assert lists.offsets is None
    else:
        assert lists.offsets is not None
        assert numpy.offsets.tolist() == lists.offsets.tolist()
    return numpy, lists


def _check_plan(problem: Problem, sections: Sections, found: Decision, capacity: int) -> None:
    assert found.offsets is not None
    full = [0] * len(problem)
    for k, index in enumerate(sections.members):
        full[index] = int(found.offsets[k])
    validate(problem, Plan(problem, tuple(full)), capacity=capacity)


@pytest.mark.parametrize("seed", range(8))
def test_the_engines_visit_the_same_nodes_from_lower_bound_to_greedy(seed: int) -> None:
    problem = aligned_instance(100 + seed, 11, shortest=1)
    sections = build_sections(problem.buffers)
    statuses = set()
    for capacity in range(lower_bound(problem), greedy_plan(problem).height + 1):
        numpy, _ = _both(sections, capacity)
        statuses.add(numpy.status)
        if numpy.status is Status.FOUND:
            _check_plan(problem, sections, numpy, capacity)
    assert Status.FOUND in statuses  # the greedy height always fits


# Every switch off alone, all on and all off (the 512 combinations run through the default
# engine in test_exact_solver.py; the interpreted list engine would take minutes over them all).
COMBINATIONS = [tuple(k != off for k in range(len(SWITCHES))) for off in range(len(SWITCHES))]
COMBINATIONS += [(True,) * len(SWITCHES), (False,) * len(SWITCHES)]


@pytest.mark.parametrize("flags", COMBINATIONS,
                         ids=lambda flags: "".join("1" if f else "0" for f in flags))
def test_techniques_switched_off_run_the_same_in_both_engines(flags: tuple[bool, ...]) -> None:
    params = SolverParams(**dict(zip(SWITCHES, flags, strict=True)))
    for seed in (2, 13):
        problem = aligned_instance(seed, 7, shortest=1)
        sections = build_sections(problem.buffers)
        low = lower_bound(problem)
        for capacity in (low, low + 3, greedy_plan(problem).height):
            _both(sections, capacity, params)


def test_a_node_budget_stops_both_engines_at_the_same_node() -> None:
    # BUDGETED: 36 is proven infeasible in 1193 nodes; every budget below stops both midway.
    sections = build_sections(BUDGETED.buffers)
    for limit in (1, 2, 17, 256, 700, 1192):
        numpy, _ = _both(sections, 36, node_limit=limit)
        assert numpy.status is Status.STOPPED
        assert numpy.nodes == limit
    numpy, _ = _both(sections, 36, node_limit=1193)
    assert numpy.status is Status.EXHAUSTED and numpy.nodes == 1193


def test_every_capacity_of_the_optimisation_takes_the_same_nodes_in_both_engines() -> None:
    result = solve_exact(BUDGETED, node_limit=None)
    assert result.plan is not None and result.plan.height == 37 and result.proven
    solver_nodes = []
    for engine in ENGINES:
        solver = Solver(engine=engine)
        sections = build_sections(BUDGETED.buffers)
        solver_nodes.append([solver.solve(sections, c).nodes for c in range(33, 38)])
    assert solver_nodes[0] == solver_nodes[1]


@pytest.mark.parametrize("seed", range(4))
def test_a_memory_that_starts_afresh_changes_neither_engine(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = aligned_instance(300 + seed, 10, shortest=1)
    sections = build_sections(problem.buffers)
    monkeypatch.setattr(exact_node, "NOGOOD_CELLS", 12)
    monkeypatch.setattr(exact_node, "MEMORY_LIMIT", 5)
    monkeypatch.setattr(exact_node, "GROUP_LIMIT", 2)
    for capacity in range(lower_bound(problem), greedy_plan(problem).height + 1):
        numpy, _ = _both(sections, capacity)
        if numpy.status is Status.FOUND:
            _check_plan(problem, sections, numpy, capacity)


def _pinned_instance(seed: int, n: int) -> Problem:
    """An aligned instance with about a third of its buffers pinned where a greedy plan put
    them, some raised a little (a pin above its lowest offset leaves a hole below it)."""
    rng = random.Random(seed)
    problem = aligned_instance(seed, n, shortest=1)
    greedy = greedy_plan(problem)
    while True:
        buffers = [
            Buffer(b.id, b.start, b.end, b.nbytes, b.alignment,
                   o + b.alignment * rng.choice((0, 0, 1, 2)))
            if rng.random() < 0.35 else b
            for b, o in zip(problem.buffers, greedy.offsets, strict=True)
        ]
        try:
            pinned = Problem(buffers)
        except InvalidProblemError:
            continue  # two raised pins clash: draw again
        if pinned.pinned:
            return pinned


@pytest.mark.parametrize("seed", range(8))
def test_pinned_problems_visit_the_same_nodes_in_both_engines(seed: int) -> None:
    problem = _pinned_instance(500 + seed, 10)
    sections = build_sections(problem.buffers)
    assert Solver(engine="lists").engine_for(sections) == "lists"
    pins_top = max(b.offset + b.nbytes for b in problem.buffers if b.offset is not None)
    statuses = set()
    for capacity in range(lower_bound(problem), greedy_plan(problem).height + 1):
        numpy, _ = _both(sections, capacity)
        statuses.add(numpy.status)
        if numpy.status is Status.FOUND:
            _check_plan(problem, sections, numpy, capacity)
        if capacity < pins_top:  # a pin past the capacity: refused before any node
            assert numpy.status is Status.EXHAUSTED and numpy.nodes == 0
    assert Status.FOUND in statuses


@pytest.mark.parametrize("flags", COMBINATIONS,
                         ids=lambda flags: "".join("1" if f else "0" for f in flags))
def test_pinned_problems_run_the_same_in_both_engines_whatever_the_switches(
    flags: tuple[bool, ...]
) -> None:
    params = SolverParams(**dict(zip(SWITCHES, flags, strict=True)))
    for seed in (3, 21):
        problem = _pinned_instance(seed, 7)
        sections = build_sections(problem.buffers)
        low = lower_bound(problem)
        for capacity in (low, low + 3, greedy_plan(problem).height):
            _both(sections, capacity, params)


def test_a_node_budget_stops_both_engines_at_the_same_node_with_pins() -> None:
    sections = build_sections(_pinned_instance(509, 12).buffers)
    full, _ = _both(sections, 50)  # a search of some 1,700 nodes
    assert full.status is not Status.STOPPED and full.nodes > 1000
    for limit in (1, 2, 17, 256, full.nodes - 1):
        numpy, _ = _both(sections, 50, node_limit=limit)
        assert numpy.status is Status.STOPPED and numpy.nodes == limit


def test_pins_at_the_boundaries_give_the_same_answer_in_both_engines() -> None:
    # a pinned at the capacity's last bytes, b touching it from below in space and c touching
    # it in time (c starts as a ends): exactly 12 fits, 11 does not; a free buffer blocked by
    # an unplaced pin goes above it.
    problem = Problem([Buffer("a", 0, 2, 4, offset=8), Buffer("b", 0, 2, 8),
                       Buffer("c", 2, 4, 12), Buffer("d", 1, 2, 0)])
    sections = build_sections(problem.buffers)
    numpy, _ = _both(sections, 12)
    assert numpy.status is Status.FOUND
    _check_plan(problem, sections, numpy, 12)
    assert _both(sections, 11)[0].status is Status.EXHAUSTED
    # A pin that leaves exactly its own size free below it, and a buffer that cannot use it.
    hole = Problem([Buffer("p", 0, 4, 4, offset=4), Buffer("q", 0, 2, 4), Buffer("r", 1, 3, 4)])
    sections = build_sections(hole.buffers)
    found, _ = _both(sections, 12)
    _check_plan(hole, sections, found, 12)
    assert _both(sections, 11)[0].status is Status.EXHAUSTED


def test_large_tables_take_the_numpy_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = build_sections(BUDGETED.buffers)
    assert Solver(engine="lists").engine_for(plain) == "lists"
    assert Solver(engine="numpy").engine_for(plain) == "numpy"
    monkeypatch.setattr(exact_node, "MEMBERS_LIMIT", 0)  # the section table is "too large"
    assert Solver(engine="lists").engine_for(plain) == "numpy"
    assert Solver(engine="lists").solve(plain, 36).nodes == 1193  # the scattered floors
    pinned = build_sections(_pinned_instance(3, 7).buffers)
    assert Solver(engine="lists").engine_for(pinned) == "numpy"


def test_the_default_engine_follows_the_build_and_a_bad_one_is_refused() -> None:
    sections = build_sections(BUDGETED.buffers)
    assert Solver().engine_for(sections) == ("lists" if compiled() else "numpy")
    with pytest.raises(InvalidArgumentError, match="engine"):
        Solver(engine="c++")


@pytest.mark.parametrize("seed", range(4))
def test_the_engines_spend_a_work_budget_alike(seed: int) -> None:
    # Work is nodes times what a node of the problem costs: both engines stop at the same node,
    # at every budget from less than one node's work to more than the search needs.
    problem = aligned_instance(100 + seed, 11, shortest=1)
    sections = build_sections(problem.buffers)
    unit = node_work(sections)
    capacity = lower_bound(problem)
    needed = _both(sections, capacity)[0].nodes
    for work in (unit - 1, unit, 37 * unit - 1, 37 * unit, needed * unit - 1, needed * unit):
        numpy, _ = _both(sections, capacity, work_limit=work)
        assert numpy.nodes == min(needed, work // unit)
        assert numpy.timed_out is False
