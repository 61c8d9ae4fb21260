"""Band repair: cut the hole at a plan's peak out as a band, then search a band of bytes exactly.

Windowed repair (:mod:`~tensorarena.planning.repair`) frees the buffers of a short window of
time; on the large traces the hole that keeps a plan above its bound is held open by buffers that
cross every short window's edges (pangu_2.6B: a 40 MiB hole at its peak tick, and 390.6 MiB
buffers alive for 13,000 ticks in the way; ``bench/RESULTS.md``). This step works in bytes:

1. **Cut.** At the peak tick of the live bytes, the largest hole in the stack of live buffers
   (ties: the lowest) is cut out as a horizontal band: every buffer above it moves down by its
   height, and the buffers that meet its bytes at other ticks are placed again by
   ``greedy_size`` with every other buffer pinned where it now is.
2. **Band searches.** While the plan is above its bound, the buffers above a target height are
   placed by one exact search in a *byte band* ``[low, high)`` below it, narrow in bytes, long
   in time: free are those buffers and every buffer wholly inside the band alive within a
   margin (:data:`MARGINS`, narrowest first) of their ticks; every other buffer that meets the
   band while a free one lives is pinned, clipped to the band. The band starts at the lowest
   hole at their ticks (in the stack of the buffers below the target, at least as wide as the
   smallest above it) and its top is raised hole by hole, lowest first, and last to the target.
   Targets: the height the caller calls good enough (``gap``), then just below each of the
   plan's highest tops (:data:`MAX_LEVELS`), freeing the fewest buffers first. A band that
   places them lowers the plan; the step goes on from there, and stops when no band does.

Every search runs on a budget of work units (:mod:`~tensorarena.planning.exact_work`;
:data:`BAND_WORK` per band, ``work_limit`` for the step; choosing a band's holes and building
its search are charged too), so
the answer depends on the input alone; the clock is only an outer bound. The cut plan is kept
only as a step to the next: what is returned is the input plan unless a validated, strictly
lower one was found.
"""

from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidPlanError, InvalidProblemError
from tensorarena.planning.bounds import aligned_lower_bound, distinct, good_enough
from tensorarena.planning.budget import StopReason
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.heuristics import PlacementArrays, place, size_order
from tensorarena.planning.options import (
    check_gap,
    check_node_limit,
    check_problem,
    check_time_limit,
)
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.repair import RepairResult
from tensorarena.planning.validate import validate
from tensorarena.sizes import check_alignment

__all__ = [
    "BAND_REPAIR_WORK",
    "BAND_WORK",
    "MARGINS",
    "MAX_BANDS",
    "MAX_BAND_BUFFERS",
    "MAX_LEVELS",
    "MAX_TICKS",
    "band_repair",
]

Int64Array = npt.NDArray[np.int64]

#: Work units one band's search may spend (the last band gets no more than what is left).
BAND_WORK = 20_000_000
#: The step's whole budget in work units, by default.
BAND_REPAIR_WORK = 100_000_000
#: Tops of the plan, from its height down, below which the buffers above are placed in turn.
MAX_LEVELS = 4
#: Band tops tried for one set of buffers at the height, lowest first.
MAX_BANDS = 32
#: Most buffers (free and pinned) in one band's search; above it the band and every higher one
#: are not searched (a node's cost grows with them, and the pins crowd the band out).
MAX_BAND_BUFFERS = 2_500
#: Ticks added on each side of the span of the buffers above the target, in this order, to choose
#: the buffers inside the band that are free (a margin that frees no more is skipped).
MARGINS: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
#: Distinct ticks (births and deaths) examined for holes; more and the step does not apply.
MAX_TICKS = 4_096


class _State:
    """The problem as arrays, and the offsets in hand."""

    def __init__(self, problem: Problem, offsets: tuple[int, ...], alignment: int | None) -> None:
        buffers = problem.buffers
        n = len(buffers)
        self.problem = problem
        self.start = np.fromiter((b.start for b in buffers), np.int64, n)
        self.end = np.fromiter((b.end for b in buffers), np.int64, n)
        self.size = np.fromiter((b.nbytes for b in buffers), np.int64, n)
        self.align = np.fromiter((max(b.alignment, alignment or 1) for b in buffers), np.int64, n)
        self.pinned = np.fromiter((b.offset is not None for b in buffers), bool, n)
        self.alignment = alignment
        # A free zero-byte buffer goes to 0, which no buffer can straddle, wherever others move.
        self.offsets = np.where((self.size == 0) & ~self.pinned, 0,
                                np.array(offsets, dtype=np.int64))

    def height(self, offsets: Int64Array) -> int:
        return int((offsets + self.size).max()) if len(offsets) else 0

    def plan(self, offsets: Int64Array) -> Plan | None:
        """The plan of ``offsets`` if it validates (every offset on the raised alignment too),
        else None."""
        if (offsets % self.align).any():
            return None
        candidate = Plan(self.problem, tuple(int(x) for x in offsets))
        try:
            validate(self.problem, candidate)
        except InvalidPlanError:
            return None
        return candidate


def band_repair(problem: Problem, plan: Plan, *, work_limit: int | None = BAND_REPAIR_WORK,
                node_limit: int | None = None, time_limit: float = math.inf,
                alignment: int | None = None, gap: float = 0.0) -> RepairResult:
    """Lower ``plan`` (a valid plan of ``problem``) by a band cut at its peak and exact searches
    in byte bands (see the module docstring), on ``work_limit`` work units and ``node_limit``
    search nodes (``None``: no budget) within ``time_limit`` seconds; it stops at a plan within
    the relative ``gap`` of the bound. ``windows`` counts the bands searched. Only a strictly
    lower plan, validated, replaces ``plan``; ``alignment`` raises every buffer's alignment, as
    :func:`~tensorarena.planning.plan` does."""
    check_problem(problem)
    budget = check_node_limit(work_limit, name="work_limit")
    node_budget = check_node_limit(node_limit)
    seconds = check_time_limit(time_limit)
    gap = check_gap(gap)
    if alignment is not None:
        check_alignment(alignment)
    validate(problem, plan)
    started = time.perf_counter()
    bound = aligned_lower_bound(problem, alignment)
    if good_enough(plan.height, bound, gap) or not problem.buffers:
        stopped = StopReason.PROVEN if plan.height <= bound else StopReason.GOOD_ENOUGH
        return RepairResult(plan, 0, 0, 0, stopped)
    if seconds <= 0:
        return RepairResult(plan, 0, 0, 0, StopReason.TIME_LIMIT)
    state = _State(problem, plan.offsets, alignment)
    best: Plan = plan
    current = state.offsets
    cut = _cut(state, current)  # one greedy placement: no search, no work units
    if cut is not None and state.height(cut) <= plan.height and (
            found := state.plan(cut)) is not None:
        current = cut  # a step to the next even at the same height; kept only if lower
        best = found if found.height < plan.height else plan
    nodes = work = bands = improved = 0
    stopped = StopReason.COMPLETE
    while not good_enough(state.height(current), bound, gap):
        left = seconds - (time.perf_counter() - started)
        if left <= 0:
            stopped = StopReason.TIME_LIMIT
            break
        if (budget is not None and work >= budget) or (node_budget is not None
                                                       and nodes >= node_budget):
            stopped = StopReason.BUDGET
            break
        for target in _targets(state, current, bound + math.floor(gap * bound)):
            rounds = _lower(state, current, target, seconds - (time.perf_counter() - started),
                            None if budget is None else budget - work,
                            None if node_budget is None else node_budget - nodes)
            nodes += rounds.nodes
            work += rounds.work
            bands += rounds.bands
            if rounds.stopped is not None:
                stopped = rounds.stopped
            if rounds.offsets is not None or rounds.stopped is not None:
                break
        if rounds.offsets is None:
            break
        current = rounds.offsets
        found = state.plan(current)
        if found is None:  # never expected: every band's plan is merged within its pins
            break
        best = found
        improved += 1
    if best is not plan:
        best = Plan(problem, best.offsets, planner=f"band_repair:{plan.planner}")
    if best.height <= bound:
        stopped = StopReason.PROVEN
    elif good_enough(best.height, bound, gap):
        stopped = StopReason.GOOD_ENOUGH
    return RepairResult(best, nodes, bands, improved, stopped, work)


def _targets(state: _State, offsets: Int64Array, goal: int) -> list[int]:
    """The heights to bring the plan under, in order: ``goal`` (good enough), then just below
    each of the :data:`MAX_LEVELS` highest tops above it, from the top down (freeing the fewest
    buffers first)."""
    tops = distinct((offsets + state.size)[(state.size > 0)])
    levels = [int(t) - 1 for t in tops[::-1][:MAX_LEVELS] if t - 1 > goal]
    return [goal, *levels]


def _gaps(state: _State, offsets: Int64Array, among: Int64Array, tick: int,
          ceiling: int) -> list[tuple[int, int]]:
    """``(bottom, top)`` of every gap between the buffers ``among`` live at ``tick``, from 0 up
    to ``ceiling`` (the last one above the highest of them)."""
    live = among[(state.start[among] <= tick) & (state.end[among] > tick)]
    order = live[np.argsort(offsets[live], kind="stable")]
    lows = offsets[order]
    tops = np.maximum.accumulate(lows + state.size[order]) if len(order) else lows
    previous = np.concatenate(([0], tops[:-1])) if len(order) else tops
    open_ = lows > previous
    holes = list(zip(previous[open_].tolist(), lows[open_].tolist(), strict=True))
    top = int(tops[-1]) if len(order) else 0
    if top < ceiling:
        holes.append((top, ceiling))
    return holes


def _cut(state: _State, offsets: Int64Array) -> Int64Array | None:
    """The plan with the largest hole at the peak tick cut out as a band, or None."""
    size, start, end = state.size, state.start, state.end
    used = size > 0
    ticks = distinct(start[used])
    if not len(ticks):
        return None
    born = np.zeros(len(ticks) + 1, np.int64)
    np.add.at(born, np.searchsorted(ticks, start[used]), size[used])
    np.add.at(born, np.searchsorted(ticks, end[used]), -size[used])
    peak = int(ticks[int(np.argmax(np.cumsum(born)[:-1]))])
    height = state.height(offsets)
    holes = _gaps(state, offsets, np.flatnonzero(used), peak, height)
    if not holes:
        return None
    low, high = max(holes, key=lambda h: (h[1] - h[0], -h[0]))
    moving = used & (offsets + size > low)
    if (moving & state.pinned).any():
        return None  # a pin above the hole cannot move down
    step = int(state.align[moving].max(initial=1))
    cut = (high - low) // step * step
    if cut <= 0:
        return None
    crossing = moving & (offsets < low + cut)
    placed = np.where(moving & ~crossing, offsets - cut, offsets)
    loose = crossing | ((size == 0) & ~state.pinned)  # free zero-byte buffers go back to 0
    # greedy_size with every other buffer pinned: its arrays with the pins set here (a Problem of
    # thousands of pins would check them pairwise).
    arrays = PlacementArrays(state.problem, state.alignment)
    arrays.pin = np.where(loose, -1, placed)
    again = place(arrays, size_order(arrays), best_fit=True)
    return np.where(loose & ~crossing, 0, again)


class _Lowered:
    """What one attempt to lower the plan by a band gave."""

    __slots__ = ("bands", "nodes", "offsets", "stopped", "too_large", "work")

    def __init__(self) -> None:
        self.offsets: Int64Array | None = None
        self.nodes = self.work = self.bands = 0
        self.too_large = False
        self.stopped: StopReason | None = None


def _lower(state: _State, offsets: Int64Array, target: int, seconds: float,
           budget: int | None, node_budget: int | None) -> _Lowered:
    """Place the buffers above ``target`` in the lowest band below it that takes them."""
    out = _Lowered()
    size, start, end = state.size, state.start, state.end
    started = time.perf_counter()
    height = state.height(offsets)
    tops = offsets + size
    bad = np.flatnonzero((size > 0) & (tops > target))
    if state.pinned[bad].any():
        return out  # a pin reaches the height: nothing lower exists
    t0, t1 = int(start[bad].min()), int(end[bad].max())
    rest = np.flatnonzero((size > 0) & (tops <= target) & (start < t1) & (end > t0))
    inner = np.concatenate(([t0], start[(start > t0) & (start < t1)],
                            end[(end > t0) & (end < t1)]))
    ticks = distinct(inner)
    if len(ticks) > MAX_TICKS:
        return out
    out.work += len(ticks) * max(1, len(rest))  # the holes: each tick reads the span's stack
    smallest = int(size[bad].min())
    gaps = {g for tick in ticks.tolist() for g in _gaps(state, offsets, rest, tick, target)
            if g[1] - g[0] >= smallest}
    if not gaps:
        return out
    step = int(state.align[bad].max())
    low = min(g[0] for g in gaps)
    # The band's top is raised hole by hole, and last to the target itself.
    highs = [*sorted({g[1] for g in gaps} - {target})[:MAX_BANDS - 1], target]
    for high in highs:
        inside = (offsets >= low) & (tops <= high) & (size > 0) & ~state.pinned
        previous = -1
        for margin in MARGINS:
            free_mask = inside & (start < t1 + margin) & (end > t0 - margin)
            free_mask[bad] = True
            free = np.flatnonzero(free_mask)
            if len(free) == previous:
                continue  # the same buffers as the narrower margin: the same search
            previous = len(free)
            left = seconds - (time.perf_counter() - started)
            if left <= 0:
                out.stopped = StopReason.TIME_LIMIT
                return out
            if (budget is not None and out.work >= budget) or (
                    node_budget is not None and out.nodes >= node_budget):
                out.stopped = StopReason.BUDGET
                return out
            allowed = BAND_WORK if budget is None else min(BAND_WORK, budget - out.work)
            nodes = None if node_budget is None else node_budget - out.nodes
            placed = _band(state, offsets, free_mask, (low, high), step, (allowed, nodes), left,
                           out)
            if placed is not None and state.height(placed) < height:
                out.offsets = placed
                return out
            if out.stopped is not None:
                return out
            if out.too_large:
                return out  # higher bands only hold more buffers
    return out


def _band(state: _State, offsets: Int64Array, free_mask: npt.NDArray[np.bool_],
          band: tuple[int, int], step: int, allowed: tuple[int, int | None], seconds: float,
          out: _Lowered) -> Int64Array | None:
    """Offsets with the ``free_mask`` buffers placed by one exact search in ``band``, every
    other buffer that meets it while one of them lives pinned, or None; ``allowed``: the
    search's work units and nodes. Counts the search in ``out``."""
    (low, high), (work, nodes) = band, allowed
    size, start, end = state.size, state.start, state.end
    tops = offsets + size
    free = np.flatnonzero(free_mask)
    step = max(step, int(state.align[free].max()))
    base = low // step * step  # the band's bottom, aligned for every free buffer
    a, b = int(start[free].min()), int(end[free].max())
    near = np.flatnonzero(~free_mask & (size > 0) & (start < b) & (end > a) & (offsets < high)
                          & (tops > base))
    buffers = state.problem.buffers
    local = [Buffer(buffers[k].id, int(start[k]), int(end[k]), int(size[k]),
                    int(state.align[k])) for k in free.tolist()]
    lives = sorted(zip(start[free].tolist(), end[free].tolist(), strict=True))
    births = np.array([s for s, _ in lives], dtype=np.int64)
    latest = np.maximum.accumulate(np.array([e for _, e in lives], dtype=np.int64))
    for j in near.tolist():
        # Pinned only where a free buffer lives: one born before j dies that dies after j's birth.
        k = int(np.searchsorted(births, end[j], "left")) - 1
        if k < 0 or latest[k] <= start[j]:
            continue
        bottom, top = max(int(offsets[j]), base), min(int(tops[j]), high)
        local.append(Buffer(buffers[j].id, max(int(start[j]), a), min(int(end[j]), b),
                            top - bottom, 1, bottom - base))
    if len(local) > MAX_BAND_BUFFERS:
        out.too_large = True
        return None
    out.bands += 1
    # Choosing the band reads the problem's arrays, and the search's set-up every pair of its
    # buffers (its overlap lists): charged before it searches.
    setup = len(size) + len(local) ** 2
    out.work += setup
    try:
        result = solve_exact(Problem(local), capacity=high - base, node_limit=nodes,
                             work_limit=max(0, work - setup), time_limit=seconds)
    except InvalidProblemError:
        return None
    out.nodes += result.nodes
    out.work += result.work
    if result.stopped_by is StopReason.TIME_LIMIT:
        out.stopped = StopReason.TIME_LIMIT
    elif result.stopped_by is StopReason.BUDGET and (
            work < BAND_WORK or (nodes is not None and result.nodes >= nodes)):
        out.stopped = StopReason.BUDGET  # the step's budget, not the band's, ran out
    if result.plan is None or result.plan.height > high - base:
        return None
    placed = offsets.copy()
    placed[free] = np.array(result.plan.offsets[:len(free)], dtype=np.int64) + base
    return placed
