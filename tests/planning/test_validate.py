"""The independent validator: every kind of fault it exists to catch, and what it refuses."""

from __future__ import annotations

import pytest

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
