"""``auto`` and ``exact``: the heuristics' portfolio, then the stages that lower its plan.

:func:`staged_search` runs the stages in order, each only while the plan is not yet good enough
(:func:`~tensorarena.planning.bounds.good_enough`) and the time limit is not spent: the portfolio;
for a minimisation, the long-lived-first sweep (:mod:`~.long_lived_first`) and, where the exact
search could not place every buffer once, the band step (:mod:`~.band_repair`); the exact search
seeded with the best plan (unless the problem's overlapping pairs could not be built in time or
memory); for a minimisation still above the bound, the peak stack (:mod:`~.peak_stack`) on what
the search left of the work budget. Each stage's work counts against the same budgets, so the
same problem gives the same plan on any machine. :mod:`~.planners` names these and chooses.
"""

from __future__ import annotations

import time

import numpy as np

from tensorarena.errors import PlanDoesNotFitError
from tensorarena.planning import heuristics
from tensorarena.planning.band_repair import BAND_REPAIR_WORK, band_repair
from tensorarena.planning.bounds import good_enough
from tensorarena.planning.budget import StopReason
from tensorarena.planning.exact import ExactResult, solve_exact
from tensorarena.planning.exact_work import can_dive
from tensorarena.planning.long_lived_first import long_lived_first
from tensorarena.planning.options import PlanOptions
from tensorarena.planning.peak_stack import PEAK_STACK_WORK, peak_stack
from tensorarena.planning.problem import Plan, PlanStatistics, Problem, lower_bound
from tensorarena.planning.progress import Reporter

__all__ = ["long_lived_first_planner", "overlapping_pairs", "portfolio_planner", "staged_search"]

# The exact search first builds every pair of time-overlapping buffers, before it looks at the
# clock: ~16 M pairs per second end to end and 4-20 bytes per pair (idealloc pangu_2.6B, 24 M
# pairs: 1.5 s and ~450 MB in all; Y_1 has 360 M). ``auto`` and ``exact`` skip it when the pairs
# cannot be built well within the time limit (a rate that leaves room for a loaded machine), or
# would not fit in memory whatever the limit, and keep the portfolio's plan. The test reads the
# time limit as given, not what the heuristics left of it: the choice must not depend on load.
_AUTO_EXACT_PAIRS_PER_SECOND = 8_000_000
_AUTO_EXACT_MAX_PAIRS = 50_000_000


def _exact(problem: Problem, options: PlanOptions, *, capacity: int | None, time_limit: float,
           node_limit: int | None, work_limit: int | None, initial: Plan,
           report: Reporter) -> tuple[Plan | None, ExactResult]:
    """(best plan the search found or None, the search's result).

    With a capacity :func:`solve_exact` answers the decision version; without one it minimises
    the height, and ``plan.optimal`` marks a proven optimum.
    """
    alignment = options.alignment
    searched = problem if alignment is None else problem.with_alignment(alignment)
    seed = Plan(searched, initial.offsets, planner=initial.planner)
    spent = report.nodes

    def forward(progress: object) -> None:
        from tensorarena.planning.progress import Progress

        assert isinstance(progress, Progress)
        report.update("exact", height=progress.height, bound=progress.bound,
                      nodes=spent + progress.nodes, tick=progress.stage == "exact")

    result = solve_exact(searched, capacity=capacity, time_limit=time_limit, initial=seed,
                         node_limit=node_limit, work_limit=work_limit, gap=options.gap,
                         progress=forward if report else None, params=options.params)
    report.nodes = spent + result.nodes
    found = result.plan
    if found is None:
        return None, result
    offsets = tuple(int(o) for o in found.offsets)
    # The search names what it returns: "exact" for a plan it found, the seed's name for the
    # seed it could not beat.
    plan = Plan(problem, offsets, planner=found.planner, optimal=bool(found.optimal),
                statistics=found.statistics)
    return plan, result


def portfolio_planner(problem: Problem, options: PlanOptions) -> Plan:
    return heuristics.portfolio(problem, alignment=options.alignment, gap=options.gap,
                                target=options.capacity if options.decision else None)


portfolio_planner.__doc__ = heuristics.portfolio.__doc__


def long_lived_first_planner(problem: Problem, options: PlanOptions, *,
                             time_limit: float | None = None,
                             initial: Plan | None = None) -> Plan:
    return long_lived_first(problem, alignment=options.alignment, gap=options.gap,
                            target=options.capacity if options.decision else None,
                            time_limit=options.time_limit if time_limit is None else time_limit,
                            initial=initial)


long_lived_first_planner.__doc__ = long_lived_first.__doc__


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


def staged_search(problem: Problem, options: PlanOptions, *, name: str, guard: bool) -> Plan:
    """The portfolio, then the exact search seeded with it, each stopping once done.

    The heuristics spend no nodes: the search gets its whole budget, so ``auto`` answers a
    decision problem exactly as ``exact`` does with the same budget.
    """
    start = time.perf_counter()
    report = Reporter(options.progress, start)
    best = portfolio_planner(problem, options)
    assert best.statistics is not None
    bound = best.statistics.bound
    nodes = work = 0
    skipped = False
    infeasible = False
    searched: StopReason | None = None
    report.update("heuristics", height=best.height, bound=bound)

    def fits() -> bool:
        return options.decision and options.capacity is not None and best.height <= options.capacity

    def done() -> bool:
        return best.optimal or good_enough(best.height, bound, options.gap) or fits()

    def left() -> float:
        return max(0.0, options.time_limit - (time.perf_counter() - start))

    def sweep() -> None:
        # Greedy by size leaves long-lived buffers stacked on top on large training traces (the
        # idealloc pangu_2.6B: 1.0334 -> 1.0076 x the bound); the search gains nothing there.
        nonlocal best
        best = long_lived_first_planner(problem, options, time_limit=left(), initial=best)
        report.update("long_lived_first", height=best.height, bound=bound)

    def stack_the_peak() -> None:
        # Holes at a one-tick peak left by buffers that die just before it (S_1: 1.0040 -> the
        # bound): rebuild with the peak's buffers stacked first, on what the search left of the
        # work budget (the search, where it runs, comes first: it can prove a plan optimal).
        nonlocal best, work
        budget = PEAK_STACK_WORK if options.work_limit is None else min(
            PEAK_STACK_WORK, options.work_limit - work)
        stacked = peak_stack(problem, best, alignment=options.alignment, time_limit=left(),
                             work_limit=max(0, budget))
        work += stacked.work
        if stacked.order:
            best = stacked.plan
            report.update("peak_stack", height=best.height, bound=bound)

    # A decision problem goes to the exact search at once; the sweep lowers plans, which only
    # a minimisation (or a decision the search cannot take up) needs.
    if not options.decision and not done() and left() > 0:
        sweep()
        if not done() and left() > 0 and not can_dive(problem, options.node_limit,
                                                       options.work_limit):
            # The search could not place every buffer once (pangu_2.6B: 114 nodes for 18,692
            # buffers): it can only return its seed. The band step can lower it.
            work_limit = options.work_limit
            banded = band_repair(problem, best, time_limit=left(), alignment=options.alignment,
                                 gap=options.gap, node_limit=options.node_limit,
                                 work_limit=BAND_REPAIR_WORK if work_limit is None
                                 else min(work_limit, BAND_REPAIR_WORK))
            best, nodes, work = banded.plan, banded.nodes, banded.work
            if banded.stopped_by is StopReason.TIME_LIMIT:
                searched = StopReason.TIME_LIMIT
            report.update("band_repair", height=best.height, bound=bound)
    if not done():
        pairs = overlapping_pairs(problem)
        limit = _AUTO_EXACT_MAX_PAIRS if not guard else min(
            _AUTO_EXACT_PAIRS_PER_SECOND * options.time_limit, _AUTO_EXACT_MAX_PAIRS)
        skipped = pairs > limit
        if skipped and pairs <= _AUTO_EXACT_MAX_PAIRS:
            searched = StopReason.TIME_LIMIT  # it would fit in memory, not in the time
    if not done() and not skipped:
        # If the portfolio already fits, spend the budget lowering it; if not, ask the decision
        # question the caller cares about: does anything fit the capacity?
        capacity = options.capacity
        target = capacity if capacity is not None and best.height > capacity else None
        # With minimize, a first fit found by the decision search is then lowered with the
        # budget left (the decision search stops at the first plan that fits).
        for question in (target, None):
            budget = None if options.node_limit is None else options.node_limit - nodes
            work_budget = None if options.work_limit is None else options.work_limit - work
            found, result = _exact(problem, options, capacity=question, time_limit=left(),
                                   node_limit=budget, work_limit=work_budget, initial=best,
                                   report=report)
            nodes += result.nodes
            work += result.work
            searched = result.stopped_by
            bound = max(bound, result.bound)
            if found is not None and found.height <= best.height:
                best = found
            if question is None:
                break
            infeasible = found is None and result.bound > question
            if not options.minimize or done() or left() <= 0 or best.height > question:
                break
    if not options.decision and not done() and left() > 0:
        stack_the_peak()
    if options.decision and not done() and not infeasible and left() > 0:
        sweep()
    optimal = best.optimal or best.height <= bound
    statistics = PlanStatistics(seconds=time.perf_counter() - start,
                                lower_bound=lower_bound(problem), nodes=nodes,
                                exact_skipped=skipped, bound=min(bound, best.height)
                                if optimal else bound,
                                stopped_by=_stopped_by(searched, optimal or fits() or infeasible,
                                                       good_enough(best.height, bound,
                                                                   options.gap)),
                                node_limit=options.node_limit, time_limit=options.time_limit,
                                work=work, work_limit=options.work_limit)
    report.update("done", height=best.height, bound=statistics.bound, nodes=nodes)
    best = Plan(problem, best.offsets, planner=f"{name}:{best.planner}", optimal=optimal,
                statistics=statistics)
    if infeasible and options.capacity is not None:
        raise PlanDoesNotFitError(
            best, options.capacity, height=best.height, lower_bound=statistics.lower_bound,
            planner=best.planner, proven=True,
        )
    return best


def _stopped_by(searched: StopReason | None, proven: bool, close: bool) -> StopReason:
    """What ended :func:`_search`: the answer's own standing first, then the search's limits."""
    if proven:
        return StopReason.PROVEN
    if close:
        return StopReason.GOOD_ENOUGH
    return StopReason.NOT_RUN if searched is None else searched
