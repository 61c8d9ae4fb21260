"""Peak stack: lower a finished plan by stacking the buffers live at its peak first.

The lower bound is the peak of live bytes, and a plan reaches it only if the buffers live at the
peak tick are packed there with no hole. A greedy plan of a large trace often is not: on training
traces the holes at the peak are left by buffers that die a few ticks before it (activations
freed as the backward pass starts), whose bytes the buffers live at the peak cannot take over
because those were placed in the same column earlier in time (``bench/RESULTS.md``). The holes
are small and spread out, so no window of time around the peak can close them: every buffer
live at the peak lives thousands of ticks.

The move here rebuilds the plan instead of repairing it. The buffers live at the peak tick (the
*crossers*) are placed first, in birth order (ties: the later death, then the larger size) or
in death order (the later death lower), so each one lands on top of those placed before it and
they stack with no hole at the peak; then every other buffer is placed around them by the
heuristics' best-fit rule, by size or long-lived first
(:func:`~tensorarena.planning.long_lived_first.long_lived_order`). Stacked by birth, the crossers
alive at an earlier tick form a contiguous stack from offset 0, and the other buffers live then
take the room above it, which the peak's slack leaves them. :data:`ORDERS` lists the candidate
orders, each placed at most once; the lowest plan is kept, and only if strictly lower than the
plan given, after validation.

Budget: placing a buffer reads every buffer placed before it (the best-fit rule's vectorised
passes), so one placement of ``m`` buffers (the non-empty or pinned ones) is charged
``m * (m + 1) // 2`` work units, known before it starts. An order is placed only if its whole
charge fits in what is left of ``work_limit``: a budget that runs out never leaves a plan half
made, and the result depends on the input and the budget alone. ``time_limit`` is an outer bound,
checked before each placement, and ``stopped_by`` says when it, not the budget, ended the move.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.bounds import aligned_lower_bound, distinct
from tensorarena.planning.budget import StopReason
from tensorarena.planning.heuristics import PlacementArrays, place, size_order
from tensorarena.planning.long_lived_first import long_lived_order
from tensorarena.planning.options import check_node_limit, check_problem, check_time_limit
from tensorarena.planning.problem import Plan, Problem
from tensorarena.planning.validate import validate

__all__ = ["ORDERS", "PEAK_STACK_WORK", "PeakStackResult", "peak_crossers", "peak_stack",
           "peak_stacked_plan", "placement_work"]

Int64Array = npt.NDArray[np.int64]

#: The candidate orders, tried in this order: (how the crossers stack, how the rest follow).
ORDERS: tuple[tuple[str, str], ...] = (
    ("birth", "size"), ("death", "size"), ("birth", "long_lived"), ("death", "long_lived"),
)
#: The long-lived fraction of the ``long_lived`` rest order (``auto``'s usual winner).
LONG_LIVED_FRACTION = 0.3
#: Default work budget: every order of :data:`ORDERS` on a problem of ~30,000 buffers.
PEAK_STACK_WORK = 2_000_000_000


@dataclass(frozen=True, slots=True)
class PeakStackResult:
    """The plan (the one given unless an order beat it), the order that made it (``""``: the
    plan given), the orders placed, the work units they cost, and what ended the move: the
    bound reached (``PROVEN``), every order placed (``COMPLETE``), an order whose charge did not
    fit the work budget (``BUDGET``) or the clock (``TIME_LIMIT``)."""

    plan: Plan
    order: str
    placements: int
    work: int
    stopped_by: StopReason


def placement_work(arrays: PlacementArrays) -> int:
    """Work units one placement of ``arrays`` is charged: ``m * (m + 1) // 2`` for its ``m``
    non-empty or pinned buffers (each reads the buffers placed before it, and itself)."""
    m = int(((arrays.size > 0) | (arrays.pin >= 0)).sum())
    return m * (m + 1) // 2


def peak_crossers(arrays: PlacementArrays) -> Int64Array:
    """Indices of the buffers live at the peak: the first time section with the most live
    bytes (between consecutive distinct starts and ends, lifetimes half-open)."""
    if arrays.n == 0:
        return np.zeros(0, np.int64)
    times = distinct(np.concatenate((arrays.start, arrays.end)))
    first = np.searchsorted(times, arrays.start)
    last = np.searchsorted(times, arrays.end)  # one past the buffer's last section
    diff = np.zeros(len(times), np.int64)
    np.add.at(diff, first, arrays.size)
    np.subtract.at(diff, last, arrays.size)
    peak = int(np.cumsum(diff).argmax())
    return np.flatnonzero((first <= peak) & (last > peak)).astype(np.int64)


def _stack(arrays: PlacementArrays, crossers: Int64Array, how: str) -> Int64Array:
    start, end, size = arrays.start[crossers], arrays.end[crossers], arrays.size[crossers]
    # lexsort: the last key is the primary one. Birth: earlier, then later death, then larger.
    # Death: later death (lower in the stack), then earlier birth, then larger.
    keys = (crossers, -size, -end, start) if how == "birth" else (crossers, -size, start, -end)
    return crossers[np.lexsort(keys)]


_REST: dict[str, Callable[[PlacementArrays], Int64Array]] = {
    "size": size_order,
    "long_lived": lambda arrays: long_lived_order(arrays, LONG_LIVED_FRACTION),
}


def peak_stack(problem: Problem, plan: Plan, *, work_limit: int | None = PEAK_STACK_WORK,
               time_limit: float = math.inf, alignment: int | None = None) -> PeakStackResult:
    """Lower ``plan`` (a valid plan of ``problem``) by placing the orders of :data:`ORDERS`
    (see the module); the lowest plan, if strictly lower than ``plan``, validated.

    ``work_limit`` is the budget in work units (:func:`placement_work` per order; ``None``: no
    budget), ``time_limit`` an outer bound in seconds. Stops at the alignment-aware bound.
    ``alignment`` raises every buffer's alignment, as :func:`~tensorarena.planning.plan` does.
    Raises :class:`~tensorarena.errors.InvalidPlanError` if ``plan`` is not valid for
    ``problem``, :class:`~tensorarena.errors.InvalidArgumentError` for a bad argument.
    """
    check_problem(problem)
    budget = check_node_limit(work_limit, name="work_limit")
    seconds = check_time_limit(time_limit)
    if not isinstance(plan, Plan):
        raise InvalidArgumentError(f"plan must be a Plan, got {type(plan).__name__}")
    arrays = PlacementArrays(problem, alignment)
    # Overlaps, offsets and pins are checked; not a capacity: a plan above it may come down.
    validate(problem, plan, capacity=plan.height)
    bound = aligned_lower_bound(problem, arrays.alignment)
    best_height = plan.height
    if best_height <= bound:
        return PeakStackResult(plan, "", 0, 0, StopReason.PROVEN)
    started = time.perf_counter()
    cost = placement_work(arrays)
    crossers = peak_crossers(arrays)
    is_crosser = np.zeros(arrays.n, np.bool_)
    is_crosser[crossers] = True
    best: Int64Array | None = None
    best_name = ""
    work = placements = 0
    stopped = StopReason.COMPLETE
    for how, rest in ORDERS:
        if best_height <= bound:
            break
        if budget is not None and work + cost > budget:
            stopped = StopReason.BUDGET
            break
        if time.perf_counter() - started >= seconds:
            stopped = StopReason.TIME_LIMIT
            break
        others = _REST[rest](arrays)
        order = np.concatenate((_stack(arrays, crossers, how), others[~is_crosser[others]]))
        offsets = place(arrays, order.astype(np.int64), best_fit=True)
        work += cost
        placements += 1
        height = int((offsets + arrays.size).max(initial=0))
        if height < best_height:
            best, best_height, best_name = offsets, height, f"{how}+{rest}"
    if best_height <= bound:
        stopped = StopReason.PROVEN
    if best is None:
        return PeakStackResult(plan, "", placements, work, stopped)
    found = Plan(problem, tuple(best.tolist()), planner=f"peak_stack:{plan.planner}",
                 optimal=best_height <= bound, statistics=plan.statistics)
    validate(problem, found, capacity=best_height)
    return PeakStackResult(found, best_name, placements, work, stopped)


def peak_stacked_plan(problem: Problem, plan: Plan, *, time_limit: float = math.inf,
                      alignment: int | None = None) -> Plan:
    """``plan`` after :func:`peak_stack` on its default budget, with ``plan``'s statistics
    counting the move's work units too, and ``stopped_by`` set to ``PROVEN`` when it reached
    the bound (what ``plan(..., repair=True)`` can call before the windowed repair)."""
    result = peak_stack(problem, plan, time_limit=time_limit, alignment=alignment)
    statistics = plan.statistics
    if statistics is not None:
        stopped = statistics.stopped_by
        if result.stopped_by is StopReason.PROVEN:
            stopped = StopReason.PROVEN
        elif result.stopped_by is StopReason.TIME_LIMIT and stopped is not StopReason.PROVEN:
            stopped = StopReason.TIME_LIMIT
        statistics = replace(statistics, work=statistics.work + result.work, stopped_by=stopped)
    found = result.plan
    return Plan(problem, found.offsets, planner=found.planner,
                optimal=plan.optimal or found.optimal, statistics=statistics)
