"""Buffers, problems and plans as plain data: what they refuse, and how they show themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorarena.errors import (
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidPlanError,
    InvalidProblemError,
)
from tensorarena.planning.problem import Buffer, Plan, Problem, lower_bound


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ((7, 0, 1, 4), "id must be a str"),
        (("a", 0.0, 1, 4), "start must be an int"),
        (("a", 0, 1, 4, True), "alignment must be an int"),
        (("a", 2, 2, 4), "must be after start"),
        (("a", 0, 1, -4), "non-negative"),
        (("a", 0, 1, 4, 3), "power of two"),
    ],
)
def test_a_bad_buffer_is_a_problem_error(fields: tuple[object, ...], words: str) -> None:
    with pytest.raises(InvalidProblemError, match=words):
        Buffer(*fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("buffers", "words"),
    [
        (None, "iterable of Buffer"),
        (["a,0,1,4"], "must be Buffer objects"),
        ([Buffer("a", 0, 1, 4), Buffer("a", 1, 2, 4)], "duplicate buffer id 'a'"),
    ],
)
def test_a_bad_problem_is_a_problem_error(buffers: object, words: str) -> None:
    with pytest.raises(InvalidProblemError, match=words):
        Problem(buffers)  # type: ignore[arg-type]


def test_an_error_while_making_the_buffers_is_not_blamed_on_the_iterable() -> None:
    def made() -> Iterator[Buffer]:
        yield Buffer("a", 0, 1, 4)
        raise TypeError("the caller's own bug")

    with pytest.raises(TypeError, match="the caller's own bug"):
        Problem(made())


def test_with_alignment_checks_the_alignment() -> None:
    problem = Problem([Buffer("a", 0, 1, 4)])
    assert problem.with_alignment(8).buffers[0].alignment == 8
    for bad in (3, "8", 8.0):
        with pytest.raises(InvalidAlignmentError):
            problem.with_alignment(bad)  # type: ignore[arg-type]


def test_a_plan_checks_its_problem_and_offset_count() -> None:
    problem = Problem([Buffer("a", 0, 1, 4)])
    with pytest.raises(InvalidArgumentError, match="must be a Problem"):
        Plan("abc", (0,))  # type: ignore[arg-type]
    with pytest.raises(InvalidPlanError, match="2 offsets for 1 buffers"):
        Plan(problem, (0, 4))
    with pytest.raises(InvalidPlanError, match="sequence of ints"):
        Plan(problem, 0)  # type: ignore[arg-type]
    assert Plan(problem, [0]).offsets == (0,)  # type: ignore[arg-type]  # a list becomes a tuple


def test_lower_bound_refuses_what_is_not_buffers() -> None:
    assert lower_bound([Buffer("a", 0, 2, 4), Buffer("b", 1, 3, 4)]) == 8
    with pytest.raises(InvalidArgumentError, match="lower_bound"):
        lower_bound("abc")  # type: ignore[arg-type]


def test_reprs_summarise_instead_of_listing_every_buffer() -> None:
    problem = Problem((Buffer(f"b{i}", i, i + 2, 4096) for i in range(5000)), name="long")
    plan = Plan(problem, tuple(4096 * (i % 2) for i in range(5000)), planner="by hand")
    assert repr(problem) == "Problem(name='long', buffers=5000, lower_bound=8192)"
    assert repr(plan) == (
        "Plan(problem='long', buffers=5000, height=8192, lower_bound=8192, "
        "planner='by hand', optimal=False)"
    )
    empty = "Problem(name='', buffers=0, lower_bound=0, capacity=12)"
    assert repr(Problem([], capacity=12)) == empty
