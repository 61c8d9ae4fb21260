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
                          then (when the search's budget cannot place every buffer once) the
                          band step (:mod:`~.band_repair`),
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
from dataclasses import replace

from tensorarena.errors import InvalidArgumentError, PlanDoesNotFitError, UnknownNameError
from tensorarena.planning import heuristics
from tensorarena.planning.bounds import DEFAULT_GAP, aligned_lower_bound
from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, DEFAULT_WORK_LIMIT
from tensorarena.planning.exact import check_point_pins
from tensorarena.planning.exact_params import SolverParams
from tensorarena.planning.options import (
    DEFAULT_TIME_LIMIT,
    PlanOptions,
    check_capacity,
    check_gap,
    check_node_limit,
    check_problem,
    check_progress,
    check_time_limit,
)
from tensorarena.planning.problem import Plan, PlanStatistics, Problem, check_pins_fit, lower_bound
from tensorarena.planning.progress import ProgressCallback
from tensorarena.planning.repaired import repaired_plan
from tensorarena.planning.staged_search import (
    long_lived_first_planner,
    overlapping_pairs,
    portfolio_planner,
    staged_search,
)
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


# Windowed repair (:mod:`~tensorarena.planning.repair`) is not a stage of ``auto``: on the large
# traces it was meant for (pangu_2.6B, S_1) it lowered nothing and cost ~17 s of pangu's 30
# (bench/window_repair.py), and their excess is not local to any window it can search
# (bench/RESULTS.md). ``plan(..., repair=True)`` (``tensorarena plan --repair``) runs the band
# step and then it after any planner (:mod:`~tensorarena.planning.repaired`). The band step is a
# stage of ``auto`` only where its exact search could not even dive to one plan (``can_dive``).

PlannerFn = Callable[[Problem, PlanOptions], Plan]


def _heuristic(name: str) -> PlannerFn:
    run = heuristics.HEURISTICS[name]

    def planner(problem: Problem, options: PlanOptions) -> Plan:
        return run(problem, alignment=options.alignment)

    planner.__doc__ = run.__doc__
    return planner


def _auto(problem: Problem, options: PlanOptions) -> Plan:
    """The portfolio, then (unless it is good enough) the exact search seeded with it, when the
    search can start within the time limit."""
    return staged_search(problem, options, name="auto", guard=True)


def _exact_planner(problem: Problem, options: PlanOptions) -> Plan:
    """The portfolio, then (unless it is good enough) the exact search seeded with it, however
    long it takes to start; optimal when proven within the time limit."""
    return staged_search(problem, options, name="exact", guard=False)


#: name → planner ``(problem, options: PlanOptions) -> Plan``.
PLANNERS: dict[str, PlannerFn] = {
    "auto": _auto,
    "exact": _exact_planner,
    **{name: _heuristic(name) for name in heuristics.HEURISTICS},
    "portfolio": portfolio_planner,
    "long_lived_first": long_lived_first_planner,
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
    techniques on and off. ``repair=True`` then lowers the plan by the band step
    (:func:`~tensorarena.planning.band_repair.band_repair`) and exact searches over the time
    windows around its peak (:func:`~tensorarena.planning.repair.repair`), each on its own
    budget, within what is left of ``time_limit``; off by default, as it gains nothing on
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
        result = repaired_plan(problem, result, time_limit=left, alignment=alignment,
                               gap=options.gap)
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
