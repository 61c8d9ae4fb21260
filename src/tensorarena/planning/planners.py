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
``long_lived_first``      long-lived buffers placed first by birth, the rest by size, over a
                          sweep of lifetime thresholds (:mod:`~.long_lived_first`)
``auto`` (default)        the portfolio; if it is not good enough, the long-lived-first sweep,
                          then the exact search within its node budget, seeded with the best
                          plan, unless the problem is too large for the search to start within
                          the limit (then the heuristics' plan stands, and
                          ``statistics.exact_skipped`` says so); a plan still above the bound
                          then gets the peak stack (:mod:`~.peak_stack`) on what is left of the
                          work budget. On a decision problem the
                          exact search comes straight after the portfolio (the sweep only
                          if it is skipped or fails): ``auto`` then answers what ``exact``
                          answers with the same budget
``exact``                 the same, but the search always runs (only a problem whose overlap
                          lists would not fit in memory is refused): the planner to choose when
                          the answer matters more than the time
========================  =====================================================================

The exact search is bounded by a budget of nodes (``node_limit``, default
:data:`~tensorarena.planning.budget.DEFAULT_NODE_LIMIT`) and one of work units that weigh a node
by the problem's size (``work_limit``, default
:data:`~tensorarena.planning.budget.DEFAULT_WORK_LIMIT`): the same input gives the same plan on any
machine under any load. ``time_limit`` is an outer bound for the whole call, generous by default
(:data:`DEFAULT_TIME_LIMIT`); ``statistics.stopped_by`` says which one ended the search.

Every planner stops as soon as it is done (:mod:`~tensorarena.planning.bounds`): at a plan whose
height is the alignment-aware lower bound (proven optimal), or within the relative ``gap`` of the
best bound known. With a capacity (``capacity=`` or the problem's own) :func:`plan` answers the
decision question, "does it fit?", and stops at the first plan that fits; ``minimize=True`` asks
for the lowest plan under the capacity instead. When nothing that fits is found,
:class:`PlanDoesNotFitError` carries the best plan, so a caller can still report how close it
came, and says whether the fit is proven impossible.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tensorarena.errors import InvalidArgumentError, PlanDoesNotFitError, UnknownNameError
from tensorarena.planning import heuristics
from tensorarena.planning.bounds import DEFAULT_GAP, aligned_lower_bound, good_enough
from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, DEFAULT_WORK_LIMIT, StopReason
from tensorarena.planning.exact import ExactResult, check_point_pins, solve_exact
from tensorarena.planning.exact_params import SolverParams
from tensorarena.planning.long_lived_first import long_lived_first
from tensorarena.planning.options import (
    check_capacity,
    check_gap,
    check_node_limit,
    check_problem,
    check_progress,
    check_time_limit,
)
from tensorarena.planning.peak_stack import PEAK_STACK_WORK, peak_stack
from tensorarena.planning.problem import (
    Plan,
    PlanStatistics,
    Problem,
    check_pins_fit,
    lower_bound,
)
from tensorarena.planning.progress import ProgressCallback, Reporter
from tensorarena.planning.repair import repaired_plan
from tensorarena.sizes import Size, check_alignment

__all__ = [
    "DEFAULT_GAP",
    "DEFAULT_NODE_LIMIT",
    "DEFAULT_TIME_LIMIT",
    "PLANNERS",
    "PlanDoesNotFitError",
    "PlanOptions",
    "overlapping_pairs",
    "plan",
]

# The exact search first builds every pair of time-overlapping buffers, before it looks at the
# clock: ~16 M pairs per second end to end and 4-20 bytes per pair (idealloc pangu_2.6B, 24 M
# pairs: 1.5 s and ~450 MB in all; Y_1 has 360 M). ``auto`` and ``exact`` skip it when the pairs
# cannot be built well within the time limit (a rate that leaves room for a loaded machine), or
# would not fit in memory whatever the limit, and keep the portfolio's plan. The test reads the
# time limit as given, not what the heuristics left of it: the choice must not depend on load.
_AUTO_EXACT_PAIRS_PER_SECOND = 8_000_000
_AUTO_EXACT_MAX_PAIRS = 50_000_000

#: The outer bound in seconds by default (``auto`` and ``exact``): well above what the default
#: node budget takes on a loaded machine (250,000 nodes of 200-450 buffers: 17-120 s on a shared
#: 2-core VM), so that the budget, not the clock, ends the search.
DEFAULT_TIME_LIMIT = 300.0

# Windowed repair (:mod:`~tensorarena.planning.repair`) is not a stage of ``auto``: on the large
# traces it was meant for (pangu_2.6B, S_1) it lowered nothing and cost ~17 s of pangu's 30
# (bench/window_repair.py), and their excess is not local to any window it can search
# (bench/RESULTS.md). ``plan(..., repair=True)`` (``tensorarena plan --repair``) runs it after
# any planner; :func:`~tensorarena.planning.repair.repair` takes any plan.


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What :func:`plan` passes to a named planner, every value already checked."""

    capacity: int | None = None  #: the arena size the plan must fit
    time_limit: float = DEFAULT_TIME_LIMIT  #: seconds for it all, an outer bound
    node_limit: int | None = DEFAULT_NODE_LIMIT  #: the exact search's budget (None: none)
    #: the exact search's budget in work units, nodes weighed by size (None: none)
    work_limit: int | None = DEFAULT_WORK_LIMIT
    alignment: int | None = None  #: every offset a multiple of at least this
    gap: float = DEFAULT_GAP  #: relative gap to the bound that is good enough
    minimize: bool = False  #: with a capacity, lower the plan after it fits
    progress: ProgressCallback | None = None  #: where :class:`Progress` reports go
    params: SolverParams | None = None  #: the exact search's techniques (None: all on)

    @property
    def decision(self) -> bool:
        """True when the question is "does it fit the capacity?", not "how low can it go?"."""
        return self.capacity is not None and not self.minimize


# ---------------------------------------------------------------------------------------------
# The exact search
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Planners by name
# ---------------------------------------------------------------------------------------------

PlannerFn = Callable[[Problem, PlanOptions], Plan]


def _heuristic(name: str) -> PlannerFn:
    run = heuristics.HEURISTICS[name]

    def planner(problem: Problem, options: PlanOptions) -> Plan:
        return run(problem, alignment=options.alignment)

    planner.__doc__ = run.__doc__
    return planner


def _portfolio(problem: Problem, options: PlanOptions) -> Plan:
    return heuristics.portfolio(problem, alignment=options.alignment, gap=options.gap,
                                target=options.capacity if options.decision else None)


_portfolio.__doc__ = heuristics.portfolio.__doc__


def _long_lived_first(problem: Problem, options: PlanOptions, *, time_limit: float | None = None,
                      initial: Plan | None = None) -> Plan:
    return long_lived_first(problem, alignment=options.alignment, gap=options.gap,
                            target=options.capacity if options.decision else None,
                            time_limit=options.time_limit if time_limit is None else time_limit,
                            initial=initial)


_long_lived_first.__doc__ = long_lived_first.__doc__


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


def _search(problem: Problem, options: PlanOptions, *, name: str, guard: bool) -> Plan:
    """The portfolio, then the exact search seeded with it, each stopping once done.

    The heuristics spend no nodes: the search gets its whole budget, so ``auto`` answers a
    decision problem exactly as ``exact`` does with the same budget.
    """
    start = time.perf_counter()
    report = Reporter(options.progress, start)
    best = _portfolio(problem, options)
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
        best = _long_lived_first(problem, options, time_limit=left(), initial=best)
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


def _auto(problem: Problem, options: PlanOptions) -> Plan:
    """The portfolio, then (unless it is good enough) the exact search seeded with it, when the
    search can start within the time limit."""
    return _search(problem, options, name="auto", guard=True)


def _exact_planner(problem: Problem, options: PlanOptions) -> Plan:
    """The portfolio, then (unless it is good enough) the exact search seeded with it, however
    long it takes to start; optimal when proven within the time limit."""
    return _search(problem, options, name="exact", guard=False)


#: name → planner ``(problem, options: PlanOptions) -> Plan``.
PLANNERS: dict[str, PlannerFn] = {
    "auto": _auto,
    "exact": _exact_planner,
    **{name: _heuristic(name) for name in heuristics.HEURISTICS},
    "portfolio": _portfolio,
    "long_lived_first": _long_lived_first,
}


#: The planners that run the exact search, and so take ``params``.
_SEARCHING = ("auto", "exact")


def plan(
    problem: Problem,
    planner: str = "auto",
    *,
    capacity: Size | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    node_limit: int | None = DEFAULT_NODE_LIMIT,
    work_limit: int | None = DEFAULT_WORK_LIMIT,
    alignment: int | None = None,
    gap: float = DEFAULT_GAP,
    minimize: bool = False,
    progress: ProgressCallback | None = None,
    params: SolverParams | None = None,
    repair: bool = False,
) -> Plan:
    """Plan offsets for ``problem`` with the named planner (see the module docstring).

    ``capacity`` (default: ``problem.capacity``) is the arena size the plan must fit, in bytes
    or as a size string (``"1MiB"``, as for a pool): the planner stops at the first plan that
    fits, or, with ``minimize=True``, goes on lowering it. When the best plan found does not fit,
    :class:`PlanDoesNotFitError` is raised with that plan attached. ``alignment`` raises every
    buffer's alignment to at least this power of two. ``node_limit`` is the exact search's
    budget in search nodes and ``work_limit`` in work units, nodes weighed by the problem's size
    (:func:`~tensorarena.planning.exact_work.node_work`; ``None``: none), which give the same
    plan on any machine; ``time_limit`` is an outer bound in seconds on the whole call
    (``inf``: none), and ``statistics.stopped_by`` says which (or a proof) ended the search.
    ``gap`` is the relative distance to the lower bound at which a plan is good enough (default
    1e-4; 0 asks for a proof of optimality). ``progress`` is called with a
    :class:`~tensorarena.planning.progress.Progress` as planning goes. ``params``
    (:class:`~tensorarena.planning.exact_params.SolverParams`) switches the exact search's
    techniques on and off. ``repair=True`` then lowers the plan by exact searches over the
    time windows around its peak (:func:`~tensorarena.planning.repair.repair`, on its own node
    budget, within what is left of ``time_limit``); off by default, as it gains nothing on
    most plans and costs search time on large ones. The plan's ``statistics`` say how long it
    all took, the nodes the searches visited and the best lower bound known (``bound``).

    Bad arguments raise before any planning: :class:`~tensorarena.errors.UnknownNameError`,
    :class:`~tensorarena.errors.InvalidArgumentError` (not a problem, a bad time, node or
    work limit or gap,
    ``minimize`` without a capacity),
    :class:`~tensorarena.errors.InvalidSizeError` (capacity) or
    :class:`~tensorarena.errors.InvalidAlignmentError`.
    """
    check_problem(problem)
    if not isinstance(planner, str) or planner not in PLANNERS:
        raise UnknownNameError(
            f"unknown planner {planner!r}; expected one of {', '.join(PLANNERS)}",
            kind="planner", name=planner, known=tuple(PLANNERS),
        )
    if alignment is not None:
        check_alignment(alignment)
    if not isinstance(minimize, bool):
        raise InvalidArgumentError(f"minimize must be a bool, got {minimize!r}")
    if not isinstance(repair, bool):
        raise InvalidArgumentError(f"repair must be a bool, got {repair!r}")
    check_progress(progress)
    if params is not None and not isinstance(params, SolverParams):
        raise InvalidArgumentError(f"params must be a SolverParams, got {type(params).__name__}")
    if params is not None and planner not in _SEARCHING:
        raise InvalidArgumentError(
            f"params switch the exact search's techniques, and planner {planner!r} runs no "
            f"exact search: use {' or '.join(map(repr, _SEARCHING))}"
        )
    options = PlanOptions(
        capacity=problem.capacity if capacity is None else check_capacity(capacity),
        time_limit=check_time_limit(time_limit),
        node_limit=check_node_limit(node_limit),
        work_limit=check_node_limit(work_limit, name="work_limit"),
        alignment=alignment,
        gap=check_gap(gap),
        minimize=minimize,
        progress=progress,
        params=params,
    )
    if planner in _SEARCHING:
        check_point_pins(problem, planner)
    check_pins_fit(problem, options.capacity)
    if minimize and options.capacity is None:
        # Without a capacity every planner already lowers the plan to within ``gap`` of the
        # bound; minimize would change nothing, and a caller who wrote it meant a capacity.
        raise InvalidArgumentError(
            "minimize=True lowers a plan after it fits a capacity, and none was given (neither "
            "capacity= nor problem.capacity): give one, or leave minimize out (without a "
            "capacity the plan is lowered to within gap of the bound anyway)"
        )
    start = time.perf_counter()
    result = PLANNERS[planner](problem, options)
    if repair:
        left = max(0.0, options.time_limit - (time.perf_counter() - start))
        result = repaired_plan(problem, result, time_limit=left, alignment=alignment)
    peak = lower_bound(problem)
    measured = result.statistics or PlanStatistics(seconds=0.0, lower_bound=peak)
    bound = measured.bound or aligned_lower_bound(problem, alignment)
    statistics = replace(measured, seconds=time.perf_counter() - start, lower_bound=peak,
                         bound=bound)
    result = replace(result, statistics=statistics)
    capacity = options.capacity
    if capacity is not None and result.height > capacity:
        raise PlanDoesNotFitError(
            result, capacity, height=result.height, lower_bound=peak,
            planner=result.planner, proven=result.optimal or bound > capacity,
        )
    return result
