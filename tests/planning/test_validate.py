"""The independent validator: every kind of fault it exists to catch, and what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorarena.errors import InvalidArgumentError, InvalidPlanError, InvalidSizeError
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.validate import is_valid, validate

PROBLEM = Problem([Buffer("a", 0, 2, 4, 4), Buffer("b", 1, 3, 4), Buffer("c", 2, 4, 8)])


@pytest.mark.parametrize(
    ("offsets", "words"),
    [
        ((0, 2, 0), "overlap in time and space"),  # a and b share bytes 2-3 at time 1
        ((2, 4, 0), "not a multiple of 4"),
        ((-4, 4, 0), "bad offset"),
        ((0, 4.0, 0), "bad offset"),
    ],
)
def test_each_fault_is_named(offsets: tuple[int, ...], words: str) -> None:
    plan = Plan(PROBLEM, offsets)
    with pytest.raises(InvalidPlanError, match=words):
        validate(PROBLEM, plan)
    assert not is_valid(PROBLEM, plan)


def test_touching_lifetimes_may_share_bytes_and_capacity_is_checked() -> None:
    plan = Plan(PROBLEM, (0, 8, 0))  # a ends at 2 where c starts: half-open lifetimes
    validate(PROBLEM, plan)
    validate(PROBLEM, plan, capacity="12B")
    with pytest.raises(InvalidPlanError, match="past the capacity 11"):
        validate(PROBLEM, plan, capacity=11)


def test_wrong_arguments_are_refused() -> None:
    plan = Plan(PROBLEM, (0, 8, 0))
    with pytest.raises(InvalidArgumentError, match="expected a Problem"):
        validate("abc", plan)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="expected a Plan"):
        validate(PROBLEM, (0, 4, 0))  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError, match="capacity"):
        validate(PROBLEM, plan, capacity=-1)


def _brute_force_clash(problem: Problem, offsets: tuple[int, ...]) -> bool:
    """Every pair, minimalloc's rule: live at once and ``a_low < b_high and b_low < a_high``."""
    pairs = list(zip(problem.buffers, offsets, strict=True))
    return any(
        a.overlaps_in_time(b) and oa < ob + b.nbytes and ob < oa + a.nbytes
        for k, (a, oa) in enumerate(pairs)
        for b, ob in pairs[k + 1 :]
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4), st.integers(0, 5),
                               st.integers(0, 12)), max_size=9))
def test_the_sweep_agrees_with_every_pair(rows: list[tuple[int, int, int, int]]) -> None:
    # Small sizes and offsets, zero-byte buffers included, so that clashes are frequent.
    problem = Problem(Buffer(f"b{i}", s, s + n, z) for i, (s, n, z, _) in enumerate(rows))
    offsets = tuple(o for *_, o in rows)
    assert is_valid(problem, Plan(problem, offsets)) == (not _brute_force_clash(problem, offsets))


def test_a_zero_byte_buffer_inside_another_clashes_and_at_its_edge_does_not() -> None:
    problem = Problem([Buffer("a", 0, 4, 8), Buffer("z", 1, 2, 0)])
    assert not is_valid(problem, Plan(problem, (0, 3)))
    assert is_valid(problem, Plan(problem, (0, 0)))
    assert is_valid(problem, Plan(problem, (0, 8)))
    with pytest.raises(InvalidPlanError, match=r"'a'.*'z'|'z'.*'a'"):
        validate(problem, Plan(problem, (0, 3)))
