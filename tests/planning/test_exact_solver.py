"""The exact search as a solver with named techniques (minimalloc's ``solver_test.cc``, in Python).

Every combination of the switches of :class:`SolverParams` is run on small problems at capacities
that fit and capacities that do not; every answer must agree with the default solver's, and every
plan found goes through the validator. Then one test per technique shows that it prunes: on a
chosen instance the search visits strictly fewer nodes with the technique than without, and gives
the same answer.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from instances import aligned_instance

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.exact_params import SolverParams, Status
from tensorarena.planning.exact_search import Solver, decide
from tensorarena.planning.exact_sections import build_sections
from tensorarena.planning.problem import Plan, Problem, lower_bound
from tensorarena.planning.validate import validate

SWITCHES = SolverParams.switches()


def instance(seed: int, n: int = 9) -> Problem:
    """Mixed alignments put some capacities above the lower bound out of reach, so the search
    must prove infeasibility the long way round, where every technique matters."""
    return aligned_instance(seed, n, shortest=1)


def _plan_of(problem: Problem, offsets: list[int]) -> Plan:
    sections = build_sections(problem.buffers)
    full = [0] * len(problem)
    for k, index in enumerate(sections.members):
        full[index] = offsets[k]
    return Plan(problem, tuple(full))


def _cases() -> list[tuple[Problem, int, Status]]:
    """(problem, capacity, the default solver's answer): infeasible and feasible capacities."""
    cases = []
    for seed in (2, 7, 11, 13):
        problem = instance(seed, n=5)
        sections = build_sections(problem.buffers)
        optimum = solve_exact(problem).plan.height  # type: ignore[union-attr]
        # The hardest two: the highest capacity that does not fit, the lowest that does.
        for capacity in range(max(lower_bound(problem), optimum - 1), optimum + 1):
            cases.append((problem, capacity, decide(sections, capacity).status))
    return cases


CASES = _cases()


def test_the_cases_hold_both_answers() -> None:
    assert {status for *_, status in CASES} == {Status.FOUND, Status.EXHAUSTED}


@pytest.mark.parametrize("flags", list(itertools.product((True, False), repeat=len(SWITCHES))),
                         ids=lambda flags: "".join("1" if f else "0" for f in flags))
def test_every_combination_of_techniques_gives_the_same_valid_answer(
    flags: tuple[bool, ...],
) -> None:
    params = SolverParams(**dict(zip(SWITCHES, flags, strict=True)))
    solver = Solver(params)
    for problem, capacity, expected in CASES:
        found = solver.solve(build_sections(problem.buffers), capacity)
        assert found.status is expected, (problem, capacity)
        if found.status is Status.FOUND:
            assert found.offsets is not None
            validate(problem, _plan_of(problem, found.offsets.tolist()), capacity=capacity)


# (switch, seed, capacity, extra switches for both runs): chosen by a search over seeds for an
# instance where the technique saves many nodes; the node counts are exact on any machine.
PRUNES = [
    ("canonical_only", 2, 33, {}),
    ("section_inference", 16, 34, {}),
    ("unallocated_floor", 47, 34, {}),
    ("check_dominance", 11, 36, {}),
    ("dynamic_decomposition", 54, 29, {}),
    ("window_preordering", 59, 34, {}),
    ("static_preordering", 27, 33, {}),
    # The true nogoods subsume most remembered failures: measured without them.
    ("remember_failures", 37, 34, {"nogoods": False}),
    ("nogoods", 13, 40, {}),
]


def test_every_technique_has_a_pruning_test() -> None:
    assert sorted(name for name, *_ in PRUNES) == sorted(SWITCHES)


@pytest.mark.parametrize(("switch", "seed", "capacity", "extra"), PRUNES,
                         ids=[name for name, *_ in PRUNES])
def test_each_technique_prunes(switch: str, seed: int, capacity: int,
                               extra: dict[str, bool]) -> None:
    sections = build_sections(instance(seed).buffers)
    with_it = decide(sections, capacity, params=SolverParams(**extra))
    without = decide(sections, capacity, params=SolverParams(**{**extra, switch: False}))
    assert with_it.status is without.status is not Status.STOPPED
    assert with_it.nodes < without.nodes


def test_params_are_frozen_checked_and_reach_solve_exact() -> None:
    params = SolverParams(nogoods=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.nogoods = True  # type: ignore[misc]
    with pytest.raises(InvalidArgumentError, match="check_dominance must be a bool"):
        SolverParams(check_dominance=1)  # type: ignore[arg-type]
    for preorders in ((), ("WAX",), "WAT", ("",)):
        with pytest.raises(InvalidArgumentError, match="preorders"):
            SolverParams(preorders=preorders)  # type: ignore[arg-type]
    problem = instance(13)
    default = solve_exact(problem, capacity=40)
    plain = solve_exact(problem, capacity=40, params=SolverParams(nogoods=False))
    assert default.proven and plain.proven and default.feasible == plain.feasible
    assert default.nodes < plain.nodes
    with pytest.raises(InvalidArgumentError, match="SolverParams"):
        solve_exact(problem, params={"nogoods": False})  # type: ignore[arg-type]
    assert "nogoods" in repr(Solver(params))
