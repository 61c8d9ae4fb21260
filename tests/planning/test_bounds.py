"""The alignment-aware lower bound, the stopping rule, and planners that stop when done."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_exact import permutation_optimum

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.bounds import aligned_lower_bound, distinct, gap_of, good_enough
from tensorarena.planning.heuristics import portfolio
from tensorarena.planning.planners import plan
from tensorarena.planning.problem import Buffer, Problem, lower_bound
from tensorarena.planning.progress import Progress


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 4), st.integers(0, 40),
                  st.sampled_from([1, 4, 8, 16])),
        min_size=1, max_size=6,
    ),
    alignment=st.sampled_from([None, 8, 32]),
)
def test_the_aligned_bound_is_a_bound(rows: list[tuple[int, int, int, int]],
                                      alignment: int | None) -> None:
    problem = Problem(Buffer(f"b{i}", s, s + n, z, a) for i, (s, n, z, a) in enumerate(rows))
    aligned = problem if alignment is None else problem.with_alignment(alignment)
    bound = aligned_lower_bound(problem, alignment)
    assert lower_bound(problem) <= bound <= permutation_optimum(list(aligned.buffers))


def test_the_aligned_bound_counts_padding_below_the_top_buffer() -> None:
    # Two 100-byte buffers live at once, 64-aligned: the lower one takes 128 bytes of the stack.
    problem = Problem([Buffer("a", 0, 2, 100, 64), Buffer("b", 1, 3, 100, 64),
                       Buffer("c", 3, 4, 30, 64)])
    assert lower_bound(problem) == 200
    assert aligned_lower_bound(problem) == 228
    # The same buffers 1-aligned, or the plan's own alignment raising them.
    loose = Problem(Buffer(b.id, b.start, b.end, b.nbytes) for b in problem.buffers)
    assert aligned_lower_bound(loose) == 200
    assert aligned_lower_bound(loose, 64) == 228
    assert aligned_lower_bound(Problem([])) == 0


def test_a_plan_at_the_aligned_bound_is_optimal_and_ends_the_search() -> None:
    # Live bytes peak at 200 but no 64-aligned plan is below 228: the portfolio reaches 228,
    # which is proven optimal at once, with no search and no time spent waiting.
    problem = Problem([Buffer("a", 0, 2, 100, 64), Buffer("b", 1, 3, 100, 64)])
    result = plan(problem, time_limit=30.0)
    assert result.height == 228 and result.optimal
    assert result.statistics is not None
    assert result.statistics.nodes == 0 and result.statistics.bound == 228
    assert result.statistics.seconds < 5.0  # far from the 30 s limit


def test_the_stopping_rule() -> None:
    assert good_enough(100, 100, 0.0) and not good_enough(101, 100, 0.0)
    assert good_enough(101, 100, 0.01) and not good_enough(102, 100, 0.01)
    assert gap_of(101, 100) == pytest.approx(0.01) and gap_of(90, 100) == 0.0


def _wide(seed: int) -> Problem:
    rng = random.Random(seed)
    buffers = []
    for k in range(60):
        start = rng.randrange(40)
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(1, 12), rng.randint(1, 64) * 16))
    return Problem(buffers)


def test_a_gap_stops_the_search_once_the_plan_is_close_enough() -> None:
    problem = _wide(3)
    greedy = portfolio(problem)
    bound = lower_bound(problem)
    assert greedy.height > bound
    loose = (greedy.height - bound) / bound + 0.001
    result = plan(problem, gap=loose, time_limit=30.0)
    assert result.height == greedy.height and not result.optimal
    assert result.statistics is not None and result.statistics.nodes == 0


@pytest.mark.parametrize("gap", [-0.1, float("nan"), float("inf"), "1%", True, None])
def test_a_bad_gap_is_refused(gap: object) -> None:
    with pytest.raises(InvalidArgumentError, match="gap"):
        plan(_wide(1), gap=gap)  # type: ignore[arg-type]


def test_progress_reports_the_best_height_against_the_bound() -> None:
    problem = _wide(5)
    seen: list[Progress] = []
    result = plan(problem, gap=0.0, time_limit=2.0, progress=seen.append)
    assert seen and seen[0].stage == "heuristics" and seen[-1].stage == "done"
    heights = [p.height for p in seen if p.height is not None]
    assert heights == sorted(heights, reverse=True)  # the best so far only ever drops
    bounds = [p.bound for p in seen]
    assert bounds == sorted(bounds)  # and the bound only ever rises
    assert seen[-1].height == result.height
    assert all(p.bound <= result.height for p in seen)
    assert seen[-1].nodes == result.statistics.nodes  # type: ignore[union-attr]


def test_a_progress_callback_that_raises_cancels_the_planner() -> None:
    class Cancelled(Exception):
        pass

    def cancel(progress: Progress) -> None:
        raise Cancelled

    with pytest.raises(Cancelled):
        plan(_wide(5), gap=0.0, progress=cancel)
    with pytest.raises(InvalidArgumentError, match="progress"):
        plan(_wide(5), progress="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("values", [[], [7], [3, 3], [5, -1, 5, 2, -1, 9],
                                    list(range(40, 0, -3)) * 2])
def test_distinct_gives_each_value_once_ascending(values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    assert distinct(array).tolist() == sorted(set(values))
    assert distinct(array).dtype == np.int64
