"""Pinned buffers (``Buffer.offset``): the model refuses pins no plan can keep, every planner
keeps them, and the exact search still finds the optimum around them."""

from __future__ import annotations

import io
import itertools
import random

import pytest

from tensorarena.errors import InvalidPlanError, InvalidProblemError, PlanDoesNotFitError
from tensorarena.planning import (
    PLANNERS,
    Buffer,
    Plan,
    Problem,
    is_valid,
    plan,
    read_problem,
    solve_exact,
    validate,
    write_problem,
)

# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def test_a_pinned_buffer_says_so() -> None:
    assert Buffer("a", 0, 1, 4, offset=8).pinned
    assert not Buffer("a", 0, 1, 4).pinned
    assert Problem([Buffer("a", 0, 1, 4, offset=0)]).pinned
    assert not Problem([Buffer("a", 0, 1, 4)]).pinned


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"offset": -1}, "negative"),
        ({"offset": 6, "alignment": 4}, "not a multiple of its alignment 4"),
        ({"offset": 1.0}, "must be an int"),
    ],
)
def test_a_pin_that_no_plan_can_keep_is_refused(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidProblemError, match=words):
        Buffer("a", 0, 1, 4, **kwargs)  # type: ignore[arg-type]


def test_two_pins_sharing_bytes_while_live_are_refused() -> None:
    with pytest.raises(InvalidProblemError, match=r"pinned buffers 'a'.*'b'.*overlap"):
        Problem([Buffer("a", 0, 4, 8, offset=0), Buffer("b", 3, 5, 8, offset=7)])


def test_a_zero_byte_pin_strictly_inside_another_pin_is_refused() -> None:
    with pytest.raises(InvalidProblemError, match="overlap"):
        Problem([Buffer("a", 0, 4, 8, offset=0), Buffer("p", 1, 2, 0, offset=3)])


@pytest.mark.parametrize(
    "buffers",
    [
        # one ends when the other starts: half-open lifetimes share no time
        [Buffer("a", 0, 4, 8, offset=0), Buffer("b", 4, 6, 8, offset=0)],
        # equal times, touching in space: [0, 8) and [8, 16)
        [Buffer("a", 0, 4, 8, offset=0), Buffer("b", 0, 4, 8, offset=8)],
        # a point at another pin's edge
        [Buffer("a", 0, 4, 8, offset=0), Buffer("p", 0, 4, 0, offset=8)],
    ],
)
def test_pins_touching_at_an_edge_are_accepted(buffers: list[Buffer]) -> None:
    problem = Problem(buffers)
    validate(problem, plan(problem, "naive"))


def test_a_pin_past_the_capacity_is_refused_by_the_problem_and_by_plan() -> None:
    buffers = [Buffer("a", 0, 1, 8, offset=8), Buffer("b", 0, 1, 8)]
    Problem(buffers, capacity=16)  # an exact fit
    past = r"'a': pinned at \[8, 16\), past the capacity 15"
    with pytest.raises(InvalidProblemError, match=past):
        Problem(buffers, capacity=15)
    with pytest.raises(InvalidProblemError, match="past the capacity 12"):
        plan(Problem(buffers), capacity=12)


def test_an_alignment_the_pin_breaks_is_refused() -> None:
    problem = Problem([Buffer("a", 0, 1, 8, offset=8), Buffer("b", 0, 1, 8)])
    with pytest.raises(InvalidProblemError, match=r"pinned offset 8 is not a multiple"):
        problem.with_alignment(16)
    with pytest.raises(InvalidProblemError, match=r"pinned offset 8 is not a multiple"):
        plan(problem, "greedy_size", alignment=16)
    assert plan(problem, "exact", alignment=8).offset_of("a") == 8


def test_validate_refuses_a_plan_that_moves_a_pin() -> None:
    problem = Problem([Buffer("a", 0, 1, 8, offset=8), Buffer("b", 2, 3, 8)])
    validate(problem, Plan(problem, (8, 0)))
    with pytest.raises(InvalidPlanError, match="'a' is pinned at 8, the plan puts it at 0"):
        validate(problem, Plan(problem, (0, 0)))


# ---------------------------------------------------------------------------------------------
# Every planner keeps the pins
# ---------------------------------------------------------------------------------------------

# A pin in the middle of the arena leaves a hole of exactly 8 bytes below it at time 0-2.
HOLE = Problem(
    [
        Buffer("pin", 0, 6, 8, offset=8),
        Buffer("fits_below", 0, 2, 8),
        Buffer("wide", 2, 6, 8),
        Buffer("late", 6, 9, 24),
        Buffer("point", 3, 4, 0),
    ],
    name="hole",
)

# Pins touching each other at an end and at an edge, free buffers around them, alignment.
TOUCHING = Problem(
    [
        Buffer("w", 0, 10, 16, alignment=16, offset=32),
        Buffer("x", 10, 12, 16, offset=32),
        Buffer("y", 0, 10, 8, offset=48),
        *(Buffer(f"f{i}", i, i + 3, 8 + 4 * (i % 3), alignment=4) for i in range(10)),
    ],
    name="touching",
)


@pytest.mark.parametrize("problem", [HOLE, TOUCHING], ids=lambda p: p.name)
@pytest.mark.parametrize("name", list(PLANNERS))
def test_every_planner_keeps_the_pins(name: str, problem: Problem) -> None:
    result = plan(problem, name)
    validate(problem, result)
    for buffer, offset in zip(problem.buffers, result.offsets, strict=True):
        if buffer.offset is not None:
            assert offset == buffer.offset


# A pin ending exactly at the capacity, a second pin touching it in space (below it) and a third
# touching it in time (born as it dies), with free buffers that fit only in what is left.
AT_CAPACITY = Problem(
    [
        Buffer("top", 0, 4, 8, offset=16),
        Buffer("under", 0, 2, 8, offset=8),
        Buffer("after", 4, 6, 24, offset=0),
        Buffer("free_low", 0, 4, 8),
        Buffer("free_late", 2, 4, 8),
    ],
    name="at_capacity",
)


# naive gives every free buffer bytes of its own: it keeps the pins but needs 40 here.
@pytest.mark.parametrize("name", [name for name in PLANNERS if name != "naive"])
def test_every_planner_fits_pins_that_end_exactly_at_the_capacity(name: str) -> None:
    result = plan(AT_CAPACITY, name, capacity=24)
    validate(AT_CAPACITY, result, capacity=24)
    assert result.height == 24
    assert [result.offset_of(b) for b in ("top", "under", "after")] == [16, 8, 0]
    assert result.offset_of("free_low") == 0 and result.offset_of("free_late") == 8


def test_the_exact_search_fills_the_hole_below_a_pin_exactly() -> None:
    # Height 24 needs fits_below under the pin and wide above it: the lower bound, proven.
    result = plan(HOLE, "exact", gap=0.0)
    validate(HOLE, result)
    assert result.height == 24
    assert result.offset_of("fits_below") == 0
    fit = solve_exact(HOLE, capacity=24)
    assert fit.plan is not None and fit.feasible
    validate(HOLE, fit.plan, capacity=24)


def test_the_exact_search_proves_a_pin_makes_a_capacity_infeasible() -> None:
    # The pin at 8 leaves 8 bytes below it; 16 bytes live beside it need 24 in all.
    problem = Problem([Buffer("pin", 0, 2, 8, offset=8), Buffer("a", 0, 2, 16)])
    with pytest.raises(PlanDoesNotFitError) as caught:
        plan(problem, "exact", capacity=23)
    assert caught.value.proven
    assert plan(problem, "exact", gap=0.0).height == 32


def test_the_exact_search_refuses_a_zero_byte_pin_above_zero_naming_the_planner() -> None:
    problem = Problem([Buffer("p", 0, 2, 0, offset=4), Buffer("a", 0, 2, 16)])
    for name in ("exact", "auto"):
        with pytest.raises(InvalidProblemError, match=rf"planner {name!r} cannot honour"):
            plan(problem, name)
    validate(problem, plan(problem, "greedy_size"))  # the greedy rule keeps clear of the point


def _brute_force_height(problem: Problem, below: int) -> bool:
    """True if some plan lower than ``below`` exists (offsets tried one by one)."""
    free = [i for i, b in enumerate(problem.buffers) if b.offset is None]
    ranges = [range(0, below - problem.buffers[i].nbytes) for i in free]
    for combo in itertools.product(*ranges):
        offsets = [b.offset if b.offset is not None else 0 for b in problem.buffers]
        for i, o in zip(free, combo, strict=True):
            offsets[i] = o
        candidate = Plan(problem, tuple(offsets))
        if candidate.height < below and is_valid(problem, candidate):
            return True
    return False


def test_the_exact_search_with_pins_is_optimal_against_brute_force() -> None:
    rng = random.Random(26)
    checked = 0
    while checked < 40:
        buffers = []
        for i in range(rng.randint(3, 6)):
            start = rng.randint(0, 5)
            buffers.append(Buffer(f"b{i}", start, start + rng.randint(1, 4),
                                  rng.choice([1, 2, 3, 4])))
        seed = plan(Problem(buffers), "greedy_size")
        pinned = [
            Buffer(b.id, b.start, b.end, b.nbytes, offset=o + rng.choice([0, 1, 3]))
            if rng.random() < 0.4 else b
            for b, o in zip(buffers, seed.offsets, strict=True)
        ]
        try:
            problem = Problem(pinned)
        except InvalidProblemError:
            continue  # the shifted pins clash: not a problem
        if not problem.pinned:
            continue
        result = plan(problem, "exact", gap=0.0)
        validate(problem, result)
        assert result.optimal
        assert not _brute_force_height(problem, result.height), problem.buffers
        checked += 1


# ---------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------


def test_csv_round_trips_pins_in_a_fixed_offset_column() -> None:
    out = io.StringIO()
    write_problem(HOLE, out)
    text = out.getvalue()
    assert text.splitlines()[0] == "id,lower,upper,size,fixed_offset"
    assert read_problem(io.StringIO(text)).buffers == HOLE.buffers


def test_csv_refuses_a_bad_pin_on_its_line() -> None:
    text = "id,lower,upper,size,alignment,fixed_offset\na,0,2,8,4,\nb,0,2,8,4,6\n"
    with pytest.raises(InvalidProblemError, match=r"line 3, column 'fixed_offset'.*alignment 4"):
        read_problem(io.StringIO(text))
