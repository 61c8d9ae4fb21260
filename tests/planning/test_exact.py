"""The exact planner against brute force, the validator and its own promises (flags, limits)."""

from __future__ import annotations

import itertools
import math
import random
import sys
import threading

import pytest
from instances import BUDGETED

from tensorarena.errors import (
    InvalidArgumentError,
    InvalidPlanError,
    InvalidProblemError,
    InvalidSizeError,
)
from tensorarena.planning.exact import ExactResult, greedy_plan, solve_exact
from tensorarena.planning.exact_params import SolverParams
from tensorarena.planning.exact_search import EXHAUSTED, FOUND, decide
from tensorarena.planning.exact_sections import build_sections
from tensorarena.planning.problem import Buffer, Plan, Problem, lower_bound
from tensorarena.planning.validate import validate

# ---------------------------------------------------------------------------------------------
# Brute force, written independently of the planner
# ---------------------------------------------------------------------------------------------


def _lowest_fit_height(buffers: list[Buffer], order: tuple[int, ...]) -> int:
    """Place in ``order``, each at the lowest aligned offset clear of placed overlapping ones."""
    offsets: dict[int, int] = {}
    for i in order:
        b = buffers[i]
        taken = sorted(
            (offsets[j], offsets[j] + buffers[j].nbytes)
            for j in offsets
            if buffers[j].overlaps_in_time(b)
        )
        offset = 0
        for low, high in taken:
            if offset + b.nbytes <= low:
                break
            offset = max(offset, -(-high // b.alignment) * b.alignment)
        offsets[i] = offset
    return max((offsets[i] + buffers[i].nbytes for i in offsets), default=0)


def permutation_optimum(buffers: list[Buffer]) -> int:
    """Listing an optimal plan by offset and placing lowest-fit in that order never rises, so
    the minimum over all orders is the optimum."""
    return min(_lowest_fit_height(buffers, p) for p in itertools.permutations(range(len(buffers))))


def offset_optimum(buffers: list[Buffer]) -> int:
    """Try every aligned offset up to the height of stacking them all, for every buffer."""
    total = sum(b.nbytes + b.alignment for b in buffers)
    choices = [range(0, total + 1, b.alignment) for b in buffers]
    best = total + 1
    for offsets in itertools.product(*choices):
        height = max(o + b.nbytes for o, b in zip(offsets, buffers, strict=True))
        if height >= best:
            continue
        clash = any(
            a.overlaps_in_time(b) and oa < ob + b.nbytes and ob < oa + a.nbytes
            for (a, oa), (b, ob) in itertools.combinations(zip(buffers, offsets, strict=True), 2)
        )
        if not clash:
            best = height
    return best


def random_buffers(
    rng: random.Random, n: int, *, max_size: int, horizon: int, alignments: tuple[int, ...] = (1,)
) -> list[Buffer]:
    out = []
    for k in range(n):
        start = rng.randrange(horizon)
        end = rng.randrange(start + 1, horizon + 2)
        out.append(Buffer(f"b{k}", start, end, rng.randint(1, max_size), rng.choice(alignments)))
    return out


def checked(problem: Problem, result: ExactResult) -> Plan:
    assert result.plan is not None
    validate(problem, result.plan)
    assert result.plan.height >= lower_bound(problem)
    return result.plan


# ---------------------------------------------------------------------------------------------
# Optimality against brute force
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_optimum_matches_permutation_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    buffers = random_buffers(rng, rng.randint(1, 6), max_size=8, horizon=6)
    problem = Problem(buffers)
    result = solve_exact(problem, time_limit=30)
    plan = checked(problem, result)
    assert result.proven and result.feasible
    assert plan.optimal
    assert plan.height == permutation_optimum(buffers)


@pytest.mark.parametrize("seed", range(15))
def test_optimum_matches_every_offset_brute_force(seed: int) -> None:
    rng = random.Random(1000 + seed)
    buffers = random_buffers(rng, rng.randint(1, 4), max_size=3, horizon=4, alignments=(1, 1, 2))
    problem = Problem(buffers)
    result = solve_exact(problem, time_limit=30)
    assert result.proven
    assert checked(problem, result).height == offset_optimum(buffers)


@pytest.mark.parametrize("seed", range(20))
def test_alignment_is_honoured_and_still_optimal(seed: int) -> None:
    rng = random.Random(2000 + seed)
    buffers = random_buffers(rng, rng.randint(2, 6), max_size=40, horizon=5, alignments=(1, 8, 16))
    problem = Problem(buffers)
    result = solve_exact(problem, time_limit=30)
    plan = checked(problem, result)
    for offset, buffer in zip(plan.offsets, buffers, strict=True):
        assert offset % buffer.alignment == 0
    assert result.proven
    assert plan.height == permutation_optimum(buffers)


def test_alignment_forces_a_gap() -> None:
    # Two 1-byte buffers at the same time, each 4-aligned: the second cannot start before 4.
    problem = Problem([Buffer("a", 0, 2, 1, 4), Buffer("b", 1, 3, 1, 4)])
    result = solve_exact(problem)
    assert result.proven
    assert sorted(checked(problem, result).offsets) == [0, 4]
    assert result.plan is not None and result.plan.height == 5


def test_pisarchyk_lee_example_reaches_124() -> None:
    # The 8 tensors of Pisarchyk & Lee (arXiv 2001.03288), as in tests/planning/data.
    rows = [
        ("t0", 0, 2, 32),
        ("t1", 1, 5, 28),
        ("t2", 2, 6, 36),
        ("t3", 3, 6, 16),
        ("t4", 4, 6, 8),
        ("t5", 5, 8, 64),
        ("t6", 6, 9, 10),
        ("t7", 7, 9, 40),
    ]
    problem = Problem(Buffer(*row) for row in rows)
    result = solve_exact(problem)
    assert result.proven
    assert checked(problem, result).height == 124


# ---------------------------------------------------------------------------------------------
# The decision version
# ---------------------------------------------------------------------------------------------


def test_capacity_below_lower_bound_is_infeasible_without_search() -> None:
    problem = Problem([Buffer("a", 0, 3, 10), Buffer("b", 1, 4, 7)])
    result = solve_exact(problem, capacity=16)
    assert result.plan is None
    assert not result.feasible
    assert result.proven
    assert result.nodes == 0
    assert result.lower_bound == 17


def test_known_infeasible_capacity_above_lower_bound() -> None:
    # Lower bound 2, but 4-aligned offsets make any plan at least 5 high.
    problem = Problem([Buffer("a", 0, 2, 1, 4), Buffer("b", 1, 3, 1, 4)])
    for capacity in (2, 3, 4):
        result = solve_exact(problem, capacity=capacity)
        assert not result.feasible and result.proven and result.plan is None
    result = solve_exact(problem, capacity=5)
    assert result.feasible and result.proven
    validate(problem, checked(problem, result), capacity=5)


@pytest.mark.parametrize("seed", range(25))
def test_decision_agrees_with_brute_force(seed: int) -> None:
    rng = random.Random(3000 + seed)
    buffers = random_buffers(rng, rng.randint(2, 6), max_size=6, horizon=5, alignments=(1, 1, 4))
    problem = Problem(buffers)
    optimum = permutation_optimum(buffers)
    for capacity in range(lower_bound(problem) - 1, optimum + 2):
        result = solve_exact(problem, capacity=capacity, time_limit=30)
        assert result.proven
        assert result.feasible == (capacity >= optimum)
        if result.feasible:
            validate(problem, checked(problem, result), capacity=capacity)


def test_decision_returns_a_fitting_initial_plan_unchanged() -> None:
    problem = Problem([Buffer("a", 0, 2, 4), Buffer("b", 1, 3, 4)])
    initial = Plan(problem, (0, 4), planner="mine")
    result = solve_exact(problem, capacity=8, initial=initial)
    assert result.feasible and result.proven and result.nodes == 0
    assert result.plan is not None and result.plan.offsets == (0, 4)
    assert result.plan.planner == "mine"


# ---------------------------------------------------------------------------------------------
# Decomposition into independent time windows
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_decomposition_changes_no_answer(seed: int) -> None:
    rng = random.Random(4000 + seed)
    # Short lifetimes over a long horizon: many windows, some of which open only mid-search;
    # mixed alignments make some capacities above the lower bound infeasible.
    buffers = []
    for k in range(14):
        start = rng.randrange(16)
        size, alignment = rng.choice((3, 5, 6, 7)), rng.choice((1, 4, 8))
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(1, 5), size, alignment))
    problem = Problem(buffers)
    sections = build_sections(problem.buffers)
    high = greedy_plan(problem).height
    for capacity in range(lower_bound(problem), high + 1):
        split = decide(sections, capacity, deadline=float("inf"))
        whole = decide(sections, capacity, params=SolverParams(dynamic_decomposition=False))
        assert split.status == whole.status
        assert split.status in (FOUND, EXHAUSTED)
        if split.status == FOUND:
            assert split.offsets is not None
            offsets = [0] * len(buffers)
            for k, index in enumerate(sections.members):
                offsets[index] = int(split.offsets[k])
            validate(problem, Plan(problem, tuple(offsets)), capacity=capacity)


@pytest.mark.parametrize("seed", range(10))
def test_memory_of_failed_states_changes_no_answer(seed: int) -> None:
    # Mixed alignments make capacities above the lower bound infeasible, so both searches must
    # prove infeasibility the long way round, where remembered states matter.
    rng = random.Random(5000 + seed)
    buffers = []
    for k in range(9):
        start = rng.randrange(8)
        size, alignment = rng.choice((3, 5, 6, 7)), rng.choice((1, 4, 8))
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(2, 6), size, alignment))
    problem = Problem(buffers)
    sections = build_sections(problem.buffers)
    for capacity in range(lower_bound(problem), greedy_plan(problem).height + 1):
        remembered = decide(sections, capacity, deadline=float("inf"))
        forgotten = decide(sections, capacity,
                           params=SolverParams(remember_failures=False, nogoods=False))
        assert remembered.status == forgotten.status
        assert remembered.nodes <= forgotten.nodes


@pytest.mark.parametrize("seed", range(6))
def test_bounded_memory_and_scattered_floors_change_no_answer(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Large problems take two other paths: floors by one scatter instead of the section table,
    # and a nogood memory that starts afresh when full. Force both on small problems.
    import tensorarena.planning.exact_node as exact_search

    rng = random.Random(6000 + seed)
    buffers = []
    for k in range(10):
        start = rng.randrange(10)
        size, alignment = rng.choice((3, 5, 6, 7)), rng.choice((1, 4, 8))
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(1, 6), size, alignment))
    problem = Problem(buffers)
    sections = build_sections(problem.buffers)
    capacities = range(lower_bound(problem), greedy_plan(problem).height + 1)
    usual = [decide(sections, c, deadline=float("inf")).status for c in capacities]
    monkeypatch.setattr(exact_search, "MEMBERS_LIMIT", 0)
    monkeypatch.setattr(exact_search, "NOGOOD_CELLS", 12)
    for capacity, expected in zip(capacities, usual, strict=True):
        found = decide(sections, capacity, deadline=float("inf"))
        assert found.status == expected
        if found.status == FOUND:
            assert found.offsets is not None
            offsets = [0] * len(buffers)
            for k, index in enumerate(sections.members):
                offsets[index] = int(found.offsets[k])
            validate(problem, Plan(problem, tuple(offsets)), capacity=capacity)
    assert usual[-1] == FOUND  # the greedy height always fits


def test_window_preorder_agrees_with_the_static_one_and_follows_new_totals() -> None:
    import numpy as np

    problem = _tight_instance(7, 30)
    sections = build_sections(problem.buffers)
    n = len(sections)
    everyone = np.arange(n, dtype=np.int64)
    section_max = np.array(
        [sections.total[sections.first[i] : sections.last[i]].max() for i in range(n)]
    )
    for heuristic in ("WAT", "TAW", "TWA", "ZT"):
        order = sections.preorder(heuristic, everyone, section_max)
        assert sorted(order.tolist()) == list(range(n))
        rank = sections.preorder_rank(heuristic)
        assert rank[order].tolist() == list(range(n))
    # A window's members, with their own totals: "T" first follows the totals given.
    members = everyone[::3]
    fresh = np.arange(len(members), dtype=np.int64)  # the last member has the largest total
    assert sections.preorder("T", members, fresh).tolist() == members[::-1].tolist()


# ---------------------------------------------------------------------------------------------
# Time limits, seeds and edge cases
# ---------------------------------------------------------------------------------------------


def _tight_instance(seed: int, n: int) -> Problem:
    rng = random.Random(seed)
    buffers = []
    for k in range(n):
        start = rng.randrange(100)
        buffers.append(Buffer(f"b{k}", start, start + rng.randint(1, 30), rng.randint(1, 64) * 16))
    return Problem(buffers)


def test_zero_time_limit_returns_the_seed_unproven() -> None:
    problem = _tight_instance(7, 120)
    seed = greedy_plan(problem)
    assert seed.height > lower_bound(problem)  # otherwise the seed would be proven optimal
    result = solve_exact(problem, time_limit=0.0)
    assert result.feasible and not result.proven
    plan = checked(problem, result)
    assert not plan.optimal
    assert plan.height <= seed.height




def test_node_limit_stops_a_search_with_the_best_plan_unproven() -> None:
    problem = BUDGETED
    full = solve_exact(problem, time_limit=math.inf)
    assert full.proven and full.plan is not None and full.plan.height > lower_bound(problem)
    for budget in (1, full.nodes // 2, full.nodes - 1):
        cut = solve_exact(problem, time_limit=math.inf, node_limit=budget)
        plan = checked(problem, cut)
        assert cut.nodes == budget  # a budget, spent exactly
        assert cut.feasible and not cut.proven and not plan.optimal
        assert full.plan.height <= plan.height <= greedy_plan(problem).height
    enough = solve_exact(problem, time_limit=math.inf, node_limit=full.nodes)
    assert enough.proven and enough.nodes == full.nodes


def test_decision_node_limit_gives_unknown_not_infeasible() -> None:
    problem = BUDGETED
    capacity = 36  # proven infeasible by the full search
    full = solve_exact(problem, capacity=capacity, time_limit=math.inf)
    assert full.proven and not full.feasible
    cut = solve_exact(problem, capacity=capacity, time_limit=math.inf, node_limit=full.nodes - 1)
    assert not cut.proven
    assert cut.plan is None and not cut.feasible
    assert cut.nodes == full.nodes - 1


def test_no_node_budget_searches_nothing() -> None:
    problem = BUDGETED
    result = solve_exact(problem, node_limit=0)
    assert result.nodes == 0 and not result.proven
    assert checked(problem, result).offsets == greedy_plan(problem).offsets


def test_the_search_leaves_the_recursion_limit_alone_and_goes_deep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every buffer live at once, each one byte: the search places them one above the other,
    # one level deeper per buffer, past the interpreter's recursion limit. It used to raise
    # sys.setrecursionlimit, process-wide, under every thread's feet.
    limit = sys.getrecursionlimit()
    n = limit + 200
    problem = Problem(Buffer(f"b{i}", 0, 1 + i % 2, 1) for i in range(n))

    def forbidden(_: int) -> None:
        raise AssertionError("the exact search changed the process-wide recursion limit")

    monkeypatch.setattr(sys, "setrecursionlimit", forbidden)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # another thread, as a server's would be, sees the limit unchanged
        while not stop.is_set():
            seen.append(sys.getrecursionlimit())
            stop.wait(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = solve_exact(problem, capacity=n, time_limit=math.inf)
    finally:
        stop.set()
        watcher.join()
    assert result.feasible and result.proven
    assert result.nodes > limit  # it went deeper than the interpreter's stack would allow
    validate(problem, checked(problem, result), capacity=n)
    assert set(seen) == {limit}


def test_never_worse_than_initial() -> None:
    rng = random.Random(5)
    buffers = random_buffers(rng, 6, max_size=8, horizon=6)
    problem = Problem(buffers)
    stacked = []
    offset = 0
    for b in buffers:
        stacked.append(offset)
        offset += b.nbytes
    initial = Plan(problem, tuple(stacked), planner="naive")
    result = solve_exact(problem, initial=initial, time_limit=0.0)
    assert checked(problem, result).height <= initial.height
    result = solve_exact(problem, initial=initial)
    assert checked(problem, result).height == permutation_optimum(buffers)


def test_optimal_initial_is_kept_and_proven() -> None:
    problem = Problem([Buffer("a", 0, 2, 4), Buffer("b", 1, 3, 4), Buffer("c", 2, 4, 4)])
    initial = Plan(problem, (0, 4, 0), planner="mine")
    result = solve_exact(problem, initial=initial)
    assert result.proven and result.plan is not None
    assert result.plan.height == 8 and result.plan.optimal


def test_zero_byte_buffers_and_empty_problem() -> None:
    empty = solve_exact(Problem([]))
    assert empty.proven and empty.plan is not None and empty.plan.height == 0
    problem = Problem([Buffer("z", 0, 5, 0, 64), Buffer("a", 1, 3, 8), Buffer("b", 2, 4, 8)])
    result = solve_exact(problem)
    plan = checked(problem, result)
    assert result.proven and plan.height == 16
    assert plan.offset_of("z") == 0


def test_bad_arguments_raise_before_searching() -> None:
    problem = Problem([Buffer("a", 0, 2, 4), Buffer("b", 1, 3, 4)])
    with pytest.raises(InvalidSizeError, match="capacity"):
        solve_exact(problem, capacity=-1)
    for time_limit in (-1.0, math.nan, "1", None):
        with pytest.raises(InvalidArgumentError, match="time_limit"):
            solve_exact(problem, time_limit=time_limit)  # type: ignore[arg-type]
    for node_limit in (-1, 1.5, "10", True):
        with pytest.raises(InvalidArgumentError, match="node_limit"):
            solve_exact(problem, node_limit=node_limit)  # type: ignore[arg-type]
    for not_a_problem in ("abc", None, problem.buffers):
        with pytest.raises(InvalidArgumentError, match="expected a Problem"):
            solve_exact(not_a_problem)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="expected a Problem"):
            greedy_plan(not_a_problem)  # type: ignore[arg-type]
    other = Problem([Buffer("x", 0, 1, 4), Buffer("y", 0, 1, 4)])
    with pytest.raises(InvalidPlanError):
        solve_exact(problem, initial=Plan(other, (0, 4)))
    with pytest.raises(InvalidPlanError):
        solve_exact(problem, initial=Plan(problem, (0, 2)))  # overlapping
    with pytest.raises(InvalidPlanError):
        solve_exact(problem, initial="0,4")  # type: ignore[arg-type]


def test_capacity_as_a_size_string() -> None:
    problem = Problem([Buffer("a", 0, 2, 512), Buffer("b", 1, 3, 512)])
    assert solve_exact(problem, capacity="1KiB").feasible
    assert not solve_exact(problem, capacity="1kB").feasible  # 1000 bytes


def test_sizes_past_int64_are_refused_not_wrapped() -> None:
    problem = Problem([Buffer("a", 0, 1, 1 << 62), Buffer("b", 0, 1, 1 << 62)])
    with pytest.raises(InvalidProblemError, match="too large"):
        solve_exact(problem)
