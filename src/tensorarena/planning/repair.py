"""Windowed repair: lower a finished plan by solving the time window around its peak exactly.

A greedy plan of a large problem often sits above its bound because of a hole at its peak, held
open by buffers elsewhere in time (pangu_2.6B: one hole at a one-tick peak, the whole gap to its
bound; ``bench/RESULTS.md``). The exact search cannot take the whole problem, but it can take a
window of time around the buffers that reach the plan's height: every buffer wholly inside the
window is free, every buffer that crosses the window's edges keeps its offset (pinned, its lifetime
clipped to the window), and everything outside is untouched. Merged back, a window plan whose height
is below the current one gives a strictly lower plan; it is validated before it is kept.

Windows widen by fixed margins (:data:`MARGINS`) and each search has a fixed node budget, so the
result depends on the input alone, not on the machine; the clock is only an outer bound.
Zero-byte buffers that are not pinned take no part in the search: those in the window go to
offset 0, which no buffer can straddle.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from tensorarena.planning.bounds import aligned_lower_bound
from tensorarena.planning.budget import StopReason
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.options import (
    check_node_limit,
    check_problem,
    check_time_limit,
)
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.validate import validate
from tensorarena.sizes import check_alignment

__all__ = ["MARGINS", "REPAIR_NODES", "WINDOW_NODES", "RepairResult", "repair"]

#: Ticks added on each side of the span of the buffers that reach the height, in this order.
MARGINS: tuple[int, ...] = (0, 2, 8, 32, 128)
#: Nodes one window's search may spend (the last window tried gets no more than what is left).
#: A node of a 1,000-buffer window with hundreds of pins costs 1-2 ms on a loaded 2-core VM.
WINDOW_NODES = 2_000
#: The repair's whole budget in search nodes, by default: every margin once, at most.
REPAIR_NODES = WINDOW_NODES * len(MARGINS)
#: Largest window searched, in buffers: the search's nodes cost time linear in it.
MAX_WINDOW_BUFFERS = 2_500


@dataclass(frozen=True, slots=True)
class RepairResult:
    """The repaired plan (``plan``; the input plan when nothing lower was found), the nodes
    searched (and the work units they cost), the windows tried, how many of them lowered the
    plan, and what ended the repair:
    the bound reached (``PROVEN``), every window tried (``COMPLETE``), the node budget
    (``BUDGET``) or the clock (``TIME_LIMIT``: the answer may differ on another machine)."""

    plan: Plan
    nodes: int
    windows: int
    improved: int
    stopped_by: StopReason = StopReason.COMPLETE
    work: int = 0


def repair(problem: Problem, plan: Plan, *, node_limit: int | None = REPAIR_NODES,
           time_limit: float = math.inf, alignment: int | None = None) -> RepairResult:
    """Lower ``plan`` (a valid plan of ``problem``) by exact searches over windows around its peak.

    Tries the windows of :data:`MARGINS` around the buffers that reach the height, each with at
    most :data:`WINDOW_NODES` nodes, until ``node_limit`` nodes are spent (``None``: no budget),
    and starts again from the narrowest margin each time a window lowers the plan (or stops,
    at the lower bound). Only a strictly
    lower plan, validated, replaces the one in hand. ``alignment`` raises every buffer's
    alignment in the search, as :func:`~tensorarena.planning.plan` does.
    """
    check_problem(problem)
    nodes_left = check_node_limit(node_limit)
    seconds = check_time_limit(time_limit)
    if alignment is not None:
        check_alignment(alignment)
    validate(problem, plan)
    started = time.perf_counter()
    best = plan
    bound = aligned_lower_bound(problem, alignment)
    nodes = work = windows = improved = 0
    margins = list(MARGINS)
    stopped = StopReason.COMPLETE
    while margins and best.height > bound:
        if nodes_left is not None and nodes >= nodes_left:
            stopped = StopReason.BUDGET
            break
        left = seconds - (time.perf_counter() - started)
        if left <= 0:
            stopped = StopReason.TIME_LIMIT
            break
        window = _window(problem, best, margins.pop(0))
        if window is None:
            continue
        budget = WINDOW_NODES if nodes_left is None else min(WINDOW_NODES, nodes_left - nodes)
        windows += 1
        lowered, spent, cost, timed_out = _solve_window(problem, best, window, budget, left,
                                                        alignment)
        nodes += spent
        work += cost
        if timed_out:
            stopped = StopReason.TIME_LIMIT
        if lowered is not None:
            best = lowered
            improved += 1
            margins = list(MARGINS)  # a new peak: look around it afresh
    if best is not plan:
        best = Plan(problem, best.offsets, planner=f"windowed_repair:{plan.planner}")
    if best.height <= bound:
        stopped = StopReason.PROVEN
    return RepairResult(best, nodes, windows, improved, stopped, work)


def _window(problem: Problem, plan: Plan, margin: int) -> tuple[int, int] | None:
    """``[t0, t1)``: the span of the buffers that reach the height, widened by ``margin``."""
    height = plan.height
    tops = [b for b, o in zip(problem.buffers, plan.offsets, strict=True)
            if b.nbytes and o + b.nbytes == height]
    if not tops:
        return None
    return min(b.start for b in tops) - margin, max(b.end for b in tops) + margin


def _solve_window(problem: Problem, plan: Plan, window: tuple[int, int], budget: int,
                  seconds: float, alignment: int | None) -> tuple[Plan | None, int, int, bool]:
    """(the merged plan if the window's search lowered the height, else None; nodes spent;
    the work they cost; whether the clock ended the search)."""
    t0, t1 = window
    height = plan.height
    offsets = list(plan.offsets)
    chosen: list[int] = []  # index in problem.buffers of each window buffer
    local: list[Buffer] = []
    outside_top = 0
    free = 0
    for i, (b, o) in enumerate(zip(problem.buffers, plan.offsets, strict=True)):
        if b.end <= t0 or b.start >= t1:
            outside_top = max(outside_top, o + b.nbytes)
            continue
        if not b.nbytes and b.offset is None:
            offsets[i] = 0  # a point at 0 clashes with nothing, wherever the window's buffers go
            continue
        chosen.append(i)
        if t0 <= b.start and b.end <= t1:
            local.append(b)
            free += b.offset is None
        else:
            # Crossing an edge: kept where it is; only its part inside the window matters.
            local.append(Buffer(b.id, max(b.start, t0), min(b.end, t1), b.nbytes, b.alignment,
                                o))
    if outside_top >= height or len(local) > MAX_WINDOW_BUFFERS or not free:
        return None, 0, 0, False
    sub = Problem(local, name=f"{problem.name}[{t0}:{t1})")
    if alignment is not None:
        sub = sub.with_alignment(alignment)
    # The plan in hand, restricted to the window, is a valid seed: clipping only removes overlaps.
    seed = Plan(sub, tuple(plan.offsets[i] for i in chosen))
    # The decision question "anything lower?" first: a fit comes fast where a minimisation
    # would spend the budget on its first probe, at the window's bound.
    result = solve_exact(sub, capacity=height - 1, initial=seed, node_limit=budget,
                         time_limit=seconds)
    found = result.plan
    timed_out = result.stopped_by is StopReason.TIME_LIMIT
    if found is None or max(found.height, outside_top) >= height:
        return None, result.nodes, result.work, timed_out
    for i, offset in zip(chosen, found.offsets, strict=True):
        offsets[i] = offset
    merged = Plan(problem, tuple(offsets))
    validate(problem, merged)
    return merged, result.nodes, result.work, timed_out
