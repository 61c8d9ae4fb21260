"""The named planners and :func:`plan`, the one entry point that chooses between them.

Every planner is a named option (minimalloc's lesson: a heuristic is a parameter, and the tests
run every parameter through the validator):

========================  =====================================================================
``naive``                 every buffer its own bytes (prefix sums): the no-reuse baseline
``greedy_size``           TFLite's greedy by size, best fit
``greedy_size_first_fit`` TFLite Micro's greedy planner: size order, lowest gap that fits
``greedy_breadth``        TFLite's greedy by breadth: widest time steps first, best fit
``heap_best_fit``         XLA's best-fit heap simulator, spatial and temporal orders
``portfolio``             all of the above, the lowest plan
``exact``                 branch and bound (``planning/exact.py``) seeded with the portfolio;
                          proves optimality or stops at the time limit with the best plan found
``auto`` (default)        the portfolio; if it is above the lower bound, the exact search
                          within the time limit, seeded with it; never worse than the portfolio
========================  =====================================================================

``auto`` and ``exact`` skip the search on problems too large for it to start within the time
limit (the plan's ``statistics.exact_skipped`` says so); a longer limit lets it run.

:func:`plan` returns the lowest plan found. When a capacity is asked for (``capacity=`` or the
problem's own) and that plan does not fit, it raises :class:`PlanDoesNotFitError`, which carries
the best plan, so a caller can still report how close it came.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from tensorarena.errors import PlanDoesNotFitError, UnknownPlannerError
from tensorarena.planning import heuristics
from tensorarena.planning._options import check_capacity, check_problem, check_time_limit
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.problem import Plan, PlanStatistics, Problem, lower_bound
from tensorarena.sizes import Size, check_alignment

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "PLANNERS",
    "PlanDoesNotFitError",
    "UnknownPlannerError",
    "overlapping_pairs",
    "plan",
]

# The exact search first builds every pair of time-overlapping buffers, before it looks at the
# clock: ~16 M pairs per second end to end and 4-20 bytes per pair (idealloc pangu_2.6B, 24 M
# pairs: 1.5 s and ~450 MB in all; Y_1 has 360 M). ``auto`` and ``exact`` skip it when the pairs
# cannot be built well within the time limit (a rate that leaves room for a loaded machine), or
# would not fit in memory whatever the limit, and keep the portfolio's plan.
_AUTO_EXACT_PAIRS_PER_SECOND = 8_000_000
_AUTO_EXACT_MAX_PAIRS = 50_000_000

#: Seconds the exact search may run by default (``auto`` and ``exact``).
DEFAULT_TIME_LIMIT = 10.0


# ---------------------------------------------------------------------------------------------
# The exact search
# ---------------------------------------------------------------------------------------------


def _exact(
    problem: Problem,
    *,
    capacity: int | None,
    time_limit: float,
    alignment: int | None,
    initial: Plan,
) -> tuple[Plan | None, bool]:
    """(best plan the search found or None, whether it proved that nothing fits ``capacity``).

    With a capacity :func:`solve_exact` answers the decision version; without one it minimises
    the height, and ``plan.optimal`` marks a proven optimum.
    """
    searched = problem if alignment is None else problem.with_alignment(alignment)
    seed = Plan(searched, initial.offsets, planner=initial.planner)
    result = solve_exact(searched, capacity=capacity, time_limit=time_limit, initial=seed)
    found = result.plan
    if found is None:
        return None, result.proven and capacity is not None
    offsets = tuple(int(o) for o in found.offsets)
    # The search names what it returns: "exact" for a plan it found, the seed's name for the
    # seed it could not beat.
    plan = Plan(problem, offsets, planner=found.planner, optimal=bool(found.optimal),
                statistics=found.statistics)
    fits = capacity is None or plan.height <= capacity
    return plan, result.proven and not fits


def _nodes(plan: Plan | None) -> int:
    return 0 if plan is None or plan.statistics is None else plan.statistics.nodes


# ---------------------------------------------------------------------------------------------
# Planners by name
# ---------------------------------------------------------------------------------------------

PlannerFn = Callable[..., Plan]


def _heuristic(name: str) -> PlannerFn:
    run = heuristics.HEURISTICS[name]

    def planner(
        problem: Problem, *, capacity: int | None, time_limit: float, alignment: int | None
    ) -> Plan:
        return run(problem, alignment=alignment)

    planner.__doc__ = run.__doc__
    return planner


def overlapping_pairs(problem: Problem) -> int:
    """How many ordered pairs of buffers overlap in time (each buffer counts itself once)."""
    if not problem.buffers:
        return 0
    starts = np.fromiter((b.start for b in problem.buffers), np.int64, len(problem))
    ends = np.fromiter((b.end for b in problem.buffers), np.int64, len(problem))
    # j overlaps i iff start_j < end_i and end_j > start_i; the two sets never double count.
    born_before_end = np.searchsorted(np.sort(starts), ends, "left")
    dead_by_start = np.searchsorted(np.sort(ends), starts, "right")
    return int((born_before_end - dead_by_start).sum())


def _search(problem: Problem, *, capacity: int | None, time_limit: float,
            alignment: int | None, name: str, guard: bool) -> Plan:
    start = time.perf_counter()
    best = heuristics.portfolio(problem, alignment=alignment)
    if best.optimal:
        return replace(best, planner=f"{name}:{best.planner}")
    remaining = max(0.0, time_limit - (time.perf_counter() - start))
    pairs = overlapping_pairs(problem) if guard else 0
    if pairs > min(_AUTO_EXACT_PAIRS_PER_SECOND * remaining, _AUTO_EXACT_MAX_PAIRS):
        skipped = PlanStatistics(seconds=time.perf_counter() - start,
                                 lower_bound=problem.lower_bound(), exact_skipped=True)
        return Plan(problem, best.offsets, planner=f"{name}:{best.planner}",
                    statistics=skipped)
    # If the portfolio already fits, spend the time lowering it; if not, ask the decision
    # question the caller cares about: does anything fit the capacity?
    target = capacity if capacity is not None and best.height > capacity else None
    found, infeasible = _exact(
        problem, capacity=target, time_limit=remaining, alignment=alignment, initial=best
    )
    nodes = _nodes(found)
    if found is not None and found.height <= best.height:
        best = found
    remaining = time_limit - (time.perf_counter() - start)
    if target is not None and not best.optimal and best.height <= target and remaining > 0:
        # The decision search stops at the first plan that fits: lower it with the time left.
        lower, _ = _exact(
            problem, capacity=None, time_limit=remaining, alignment=alignment, initial=best
        )
        nodes += _nodes(lower)
        if lower is not None and lower.height <= best.height:
            best = lower
    statistics = PlanStatistics(seconds=time.perf_counter() - start,
                                lower_bound=problem.lower_bound(), nodes=nodes)
    best = Plan(problem, best.offsets, planner=f"{name}:{best.planner}", optimal=best.optimal,
                statistics=statistics)
    if infeasible and capacity is not None:
        raise PlanDoesNotFitError(
            best, capacity, height=best.height, lower_bound=problem.lower_bound(),
            planner=best.planner, proven=True,
        )
    return best


def _auto(problem: Problem, *, capacity: int | None, time_limit: float,
          alignment: int | None) -> Plan:
    """The portfolio, then (if it is above the lower bound) the exact search seeded with it."""
    return _search(problem, capacity=capacity, time_limit=time_limit, alignment=alignment,
                   name="auto", guard=True)


def _exact_planner(problem: Problem, *, capacity: int | None, time_limit: float,
                   alignment: int | None) -> Plan:
    """Branch and bound seeded with the portfolio; optimal when proven within the time limit."""
    return _search(problem, capacity=capacity, time_limit=time_limit, alignment=alignment,
                   name="exact", guard=True)


#: name → planner ``(problem, *, capacity, time_limit, alignment) -> Plan``.
PLANNERS: dict[str, PlannerFn] = {
    "auto": _auto,
    "exact": _exact_planner,
    **{name: _heuristic(name) for name in heuristics.HEURISTICS},
}


def plan(
    problem: Problem,
    planner: str = "auto",
    *,
    capacity: Size | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    alignment: int | None = None,
) -> Plan:
    """Plan offsets for ``problem`` with the named planner (see the module docstring).

    ``capacity`` (default: ``problem.capacity``) is the arena size the plan must fit, in bytes
    or as a size string (``"1MiB"``, as for a pool); when the best plan found does not fit,
    :class:`PlanDoesNotFitError` is raised with that plan attached. ``alignment`` raises every
    buffer's alignment to at least this power of two. ``time_limit`` bounds the exact search,
    in seconds (``inf``: no limit). The plan's ``statistics`` say how long it all took and how
    many nodes the exact search visited.

    Bad arguments raise before any planning: :class:`UnknownPlannerError`,
    :class:`~tensorarena.errors.InvalidArgumentError` (not a problem, a bad time limit),
    :class:`~tensorarena.errors.InvalidSizeError` (capacity) or
    :class:`~tensorarena.errors.InvalidAlignmentError`.
    """
    check_problem(problem)
    if not isinstance(planner, str) or planner not in PLANNERS:
        raise UnknownPlannerError(
            f"unknown planner {planner!r}; expected one of {', '.join(PLANNERS)}"
        )
    if alignment is not None:
        check_alignment(alignment)
    capacity = problem.capacity if capacity is None else check_capacity(capacity)
    time_limit = check_time_limit(time_limit)
    start = time.perf_counter()
    result = PLANNERS[planner](
        problem, capacity=capacity, time_limit=time_limit, alignment=alignment
    )
    bound = lower_bound(problem)
    measured = result.statistics or PlanStatistics(seconds=0.0, lower_bound=bound)
    statistics = replace(measured, seconds=time.perf_counter() - start, lower_bound=bound)
    result = replace(result, statistics=statistics)
    if capacity is not None and result.height > capacity:
        proven = result.optimal  # the optimum itself is too high
        raise PlanDoesNotFitError(
            result, capacity, height=result.height, lower_bound=bound,
            planner=result.planner, proven=proven,
        )
    return result
