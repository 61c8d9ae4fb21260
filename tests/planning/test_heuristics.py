"""Heuristic planners: every one through the validator on a corpus, and each against a slow,
obviously correct reference of the rule it claims to implement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorarena.errors import InvalidAlignmentError, InvalidArgumentError, InvalidProblemError
from tensorarena.planning import heuristics as h
from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.problem import Buffer, Problem, lower_bound
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"
PLANNERS = sorted(h.HEURISTICS)


def pisarchyk() -> Problem:
    return read_problem(DATA / "pisarchyk_lee.csv")


def hand_cases() -> list[Problem]:
    return [
        Problem([]),
        Problem([Buffer("solo", 0, 1, 7)]),
        Problem([Buffer("a", 0, 2, 4), Buffer("b", 2, 4, 4)]),  # touch at t=2: may share
        Problem([Buffer("a", 0, 3, 4), Buffer("b", 1, 4, 4), Buffer("c", 2, 5, 4)]),
        Problem([Buffer("z", 0, 9, 0), Buffer("a", 0, 9, 5), Buffer("y", 3, 4, 0)]),
        Problem([Buffer("a", 0, 4, 3, 16), Buffer("b", 1, 2, 5, 8), Buffer("c", 2, 6, 1, 32)]),
        read_problem(DATA / "toy.12.csv"),
        pisarchyk(),
    ]


def problems(max_buffers: int = 14) -> st.SearchStrategy[Problem]:
    @st.composite
    def build(draw: st.DrawFn) -> Problem:
        n = draw(st.integers(0, max_buffers))
        buffers = []
        for i in range(n):
            start = draw(st.integers(0, 12))
            length = draw(st.integers(1, 6))
            size = draw(st.integers(0, 40))
            alignment = draw(st.sampled_from([1, 1, 1, 2, 8]))
            buffers.append(Buffer(f"b{i}", start, start + length, size, alignment))
        return Problem(buffers)

    return build()


# -- a slow reference of the placement rule, written from the description ----------------------


def reference_place(problem: Problem, order: list[int], *, best_fit: bool, alignment: int = 1
                    ) -> list[int]:
    buffers = problem.buffers
    offsets = [0] * len(buffers)
    placed: list[int] = []
    for i in order:
        b = buffers[i]
        align = max(b.alignment, alignment)
        if b.nbytes == 0:
            continue
        others = sorted(
            (j for j in placed if buffers[j].overlaps_in_time(b)),
            key=lambda j: (offsets[j], placed.index(j)),
        )
        floor = 0
        chosen = None
        chosen_gap = None
        for j in others:
            begin = -(-floor // align) * align
            gap = offsets[j] - floor
            if begin + b.nbytes <= offsets[j]:
                if not best_fit:
                    chosen = begin
                    break
                if chosen_gap is None or gap < chosen_gap:
                    chosen, chosen_gap = begin, gap
            floor = max(floor, offsets[j] + buffers[j].nbytes)
        if chosen is None:
            chosen = -(-floor // align) * align
        offsets[i] = chosen
        placed.append(i)
    return offsets


def reference_breadth_order(problem: Problem) -> list[int]:
    buffers = problem.buffers
    times = sorted({t for b in buffers for t in (b.start, b.end)})
    breadth = {t: sum(b.nbytes for b in buffers if b.start <= t < b.end) for t in times}
    steps = sorted(times, key=lambda t: (-breadth[t], t))
    order: list[int] = []
    done: set[int] = set()
    for t in steps:
        live = [i for i, b in enumerate(buffers) if b.start <= t < b.end and i not in done]
        live.sort(key=lambda i: (-buffers[i].nbytes, -(buffers[i].end - buffers[i].start), i))
        order += live
        done.update(live)
    return order


def reference_size_order(problem: Problem) -> list[int]:
    b = problem.buffers
    return sorted(range(len(b)), key=lambda i: (-b[i].nbytes, -(b[i].end - b[i].start), i))


# -- every planner through the validator ---------------------------------------------------------


@pytest.mark.parametrize("name", PLANNERS)
def test_every_planner_is_valid_on_hand_cases(name: str) -> None:
    for problem in hand_cases():
        plan = h.HEURISTICS[name](problem)
        validate(problem, plan)
        assert plan.problem is problem
        assert plan.height >= lower_bound(problem)
        assert plan.optimal == (plan.height == lower_bound(problem))


@pytest.mark.parametrize("name", PLANNERS)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(problem=problems(), alignment=st.sampled_from([None, 1, 4, 64]))
def test_every_planner_is_valid_on_random_problems(
    name: str, problem: Problem, alignment: int | None
) -> None:
    plan = h.HEURISTICS[name](problem, alignment=alignment)
    validate(problem, plan)
    if alignment is not None:
        assert all(offset % alignment == 0 for offset in plan.offsets)
        validate(problem.with_alignment(alignment), plan)


# -- each rule against its reference -------------------------------------------------------------


@settings(max_examples=150, deadline=None, derandomize=True)
@given(problem=problems(), alignment=st.sampled_from([1, 8]))
def test_greedy_size_matches_reference(problem: Problem, alignment: int) -> None:
    order = reference_size_order(problem)
    best = h.greedy_size(problem, alignment=alignment)
    first = h.greedy_size_first_fit(problem, alignment=alignment)
    want_best = reference_place(problem, order, best_fit=True, alignment=alignment)
    want_first = reference_place(problem, order, best_fit=False, alignment=alignment)
    assert list(best.offsets) == want_best
    assert list(first.offsets) == want_first


@settings(max_examples=150, deadline=None, derandomize=True)
@given(problem=problems())
def test_breadth_order_matches_reference(problem: Problem) -> None:
    arrays = h.PlacementArrays(problem, None)
    assert h.breadth_order(arrays).tolist() == reference_breadth_order(problem)
    plan = h.greedy_breadth(problem)
    assert list(plan.offsets) == reference_place(
        problem, reference_breadth_order(problem), best_fit=True
    )


def test_breadth_order_on_long_lifetimes() -> None:
    # Many ticks exercise every level of the sparse table, including exact powers of two.
    buffers = [Buffer(f"b{i}", i, i + 1 + (i * 7) % 33, 1 + (i * 13) % 17) for i in range(80)]
    problem = Problem(buffers)
    arrays = h.PlacementArrays(problem, None)
    assert h.breadth_order(arrays).tolist() == reference_breadth_order(problem)


# -- documented behaviour ------------------------------------------------------------------------


def test_pisarchyk_lee_example_reaches_its_optimum() -> None:
    problem = pisarchyk()
    assert lower_bound(problem) == 124
    for name in ("greedy_size", "greedy_breadth", "portfolio"):
        plan = h.HEURISTICS[name](problem)
        validate(problem, plan)
        assert plan.height == 124, name
        assert plan.optimal


def test_naive_offsets_are_aligned_prefix_sums() -> None:
    problem = Problem([Buffer("a", 0, 1, 5), Buffer("b", 0, 1, 3, 8), Buffer("c", 5, 6, 2)])
    assert h.naive(problem).offsets == (0, 8, 11)
    assert h.naive(problem, alignment=4).offsets == (0, 8, 12)
    assert h.naive(problem).planner == "naive"


def test_best_fit_and_first_fit_differ_where_they_should() -> None:
    # Stacking p, q, r, s leaves two gaps during [5, 10): [0, 6) and the snug [10, 13).
    # x (3 bytes) takes the lowest under first fit and the snug one under best fit.
    problem = Problem(
        [
            Buffer("p", 0, 5, 6),
            Buffer("q", 0, 10, 4),
            Buffer("r", 0, 5, 3),
            Buffer("s", 0, 10, 2),
            Buffer("x", 6, 8, 3),
        ]
    )
    arrays = h.PlacementArrays(problem, None)
    order = np.arange(5, dtype=np.int64)
    best = h.place(arrays, order, best_fit=True).tolist()
    first = h.place(arrays, order, best_fit=False).tolist()
    assert best == [0, 6, 10, 13, 10]
    assert first == [0, 6, 10, 13, 0]
    # Alignment 4 lifts every offset to a multiple of 4; the snug gap is then [12, 16).
    aligned = h.PlacementArrays(problem, 4)
    assert h.place(aligned, order, best_fit=True).tolist() == [0, 8, 12, 16, 12]
    assert h.place(aligned, order, best_fit=False).tolist() == [0, 8, 12, 16, 0]


def test_gap_choice_best_vs_first() -> None:
    # Placed in size order: A [0,10) 10 bytes, C [0,10) 4 bytes on top... build gaps by hand.
    problem = Problem(
        [
            Buffer("base", 0, 10, 50),  # offset 0
            Buffer("p", 0, 5, 40),  # over base: 50
            Buffer("q", 0, 10, 30),  # over p: 90
            Buffer("r", 5, 10, 10),  # time 5..10: p is gone, best gap is 50..90 -> 50
            Buffer("s", 0, 5, 8),  # 0..5: p ends at 90, q 90..120; on top 120
        ]
    )
    plan = h.greedy_size(problem)
    validate(problem, plan)
    assert plan.as_dict() == {"base": 0, "p": 50, "q": 90, "r": 50, "s": 120}


def test_portfolio_never_worse_than_any_heuristic() -> None:
    for problem in hand_cases():
        best = h.portfolio(problem)
        assert best.planner.startswith("portfolio:")
        for name in PLANNERS:
            assert best.height <= h.HEURISTICS[name](problem).height


@settings(max_examples=40, deadline=None, derandomize=True)
@given(problem=problems())
def test_portfolio_is_the_minimum(problem: Problem) -> None:
    best = h.portfolio(problem)
    assert best.height == min(h.HEURISTICS[name](problem).height for name in PLANNERS)


def test_bad_alignment_is_refused() -> None:
    with pytest.raises(InvalidAlignmentError):
        h.greedy_size(pisarchyk(), alignment=3)


def test_sizes_that_would_overflow_are_refused() -> None:
    problem = Problem([Buffer("a", 0, 1, 1 << 61), Buffer("b", 0, 1, 1 << 61)])
    with pytest.raises(InvalidProblemError, match="too large"):
        h.portfolio(problem)


@pytest.mark.parametrize("name", sorted(h.HEURISTICS))
def test_something_that_is_not_a_problem_is_refused(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="expected a Problem, got str"):
        h.HEURISTICS[name]("id,lower,upper,size\na,0,1,4\n")


def test_every_heuristic_reports_its_own_statistics() -> None:
    problem = pisarchyk()
    for name, heuristic in h.HEURISTICS.items():
        statistics = heuristic(problem).statistics
        assert statistics is not None, name
        assert (statistics.lower_bound, statistics.nodes) == (lower_bound(problem), 0), name
        assert statistics.seconds > 0, name  # measured, not left at a default
