"""The exact planner: a branch and bound that proves a plan optimal or stops at its node budget.

Two questions, one search (:mod:`tensorarena.planning.exact_search`):

- the *decision* version, ``solve_exact(problem, capacity=C)``: is there a plan of height at most
  ``C``? The answer is a plan, a proof that none exists, or "unknown" when the budget ran out;
- the *optimisation* version, ``solve_exact(problem)``: the lowest height. It starts from
  ``initial`` (say a heuristic's plan; without one, a greedy plan of its own), then asks the
  decision question at lower capacities: first at the lower bound (the peak of live bytes; real
  problems often meet it), then by bisection between what is proven infeasible and the best plan
  found. A plan is proven optimal when the capacity just below it is proven infeasible. The
  answer is never worse than ``initial``.

Both are bounded by a budget of search nodes (:mod:`~tensorarena.planning.budget`), which stops
them at the same place on any machine, and by the clock as an outer bound. The optimisation
version gives each probe a fixed number of nodes (:data:`PROBE_NODES`; the last candidate
capacity gets all that is left), not a share of the time left: a probe that cannot settle its
capacity gives up, and the bisection goes on above it, so the budget buys many cheap fits rather
than one hopeless proof. The probes do not depend on the budget, so a larger budget only ever
goes further along the same path.

Capacities are probed in steps of the *granule*, the gcd of every size and every alignment above
1: every canonical plan's height is a multiple of it, so nothing in between needs asking.

Preprocessing (time sections and the overlap lists) runs before the clock is first checked: on
traces with tens of millions of overlapping pairs it alone takes seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tensorarena.errors import InvalidArgumentError, InvalidPlanError, InvalidProblemError
from tensorarena.planning.bounds import aligned_lower_bound, good_enough
from tensorarena.planning.budget import DEFAULT_NODE_LIMIT, DEFAULT_WORK_LIMIT, StopReason
from tensorarena.planning.exact_params import SolverParams
from tensorarena.planning.exact_search import EXHAUSTED, FOUND, Solver
from tensorarena.planning.exact_sections import Sections, build_sections
from tensorarena.planning.exact_work import node_budget, node_work
from tensorarena.planning.options import (
    check_capacity,
    check_gap,
    check_int64,
    check_node_limit,
    check_problem,
    check_progress,
    check_time_limit,
)
from tensorarena.planning.problem import Plan, PlanStatistics, Problem
from tensorarena.planning.progress import ProgressCallback, Reporter
from tensorarena.planning.validate import validate
from tensorarena.sizes import Size

__all__ = ["PROBE_NODES", "ExactResult", "check_point_pins", "greedy_plan", "solve_exact"]

#: Nodes one probe of the optimisation version may spend (the last candidate capacity gets all
#: that is left). On minimalloc's D and J the fits near their best known heights take 7,000-12,000
#: nodes, while the capacities just below stay unsettled after 60,000.
PROBE_NODES = 30_000


@dataclass(frozen=True, slots=True)
class ExactResult:
    """What the exact planner found, and what it proved.

    ``plan`` is the best plan found (``None`` only in the decision version when nothing within
    the capacity was found); ``plan.optimal`` is set when its height is proven minimal.
    ``feasible`` says a plan within the capacity (if any) is in hand. ``proven`` says the answer
    is final: in the optimisation version the plan is optimal; in the decision version either a
    plan within the capacity was found or none exists. ``nodes`` counts search nodes,
    ``seconds`` the wall time, ``lower_bound`` the peak of live bytes, ``bound`` the best lower
    bound proven (alignment padding counted, raised past every capacity proven infeasible).
    ``stopped_by`` says what ended the search; ``node_limit``, ``work_limit`` and
    ``time_limit`` are the budgets and the outer bound it ran under (``None``/``inf``: none),
    ``work`` the work units used (``nodes`` times what a node of this problem costs).
    """

    plan: Plan | None
    feasible: bool
    proven: bool
    nodes: int
    seconds: float
    lower_bound: int = 0
    bound: int = 0
    stopped_by: StopReason = StopReason.PROVEN
    node_limit: int | None = None
    time_limit: float = float("inf")
    work: int = 0
    work_limit: int | None = None


def solve_exact(
    problem: Problem,
    *,
    capacity: Size | None = None,
    time_limit: float = float("inf"),
    initial: Plan | None = None,
    node_limit: int | None = DEFAULT_NODE_LIMIT,
    work_limit: int | None = DEFAULT_WORK_LIMIT,
    gap: float = 0.0,
    progress: ProgressCallback | None = None,
    params: SolverParams | None = None,
) -> ExactResult:
    """Branch and bound over canonical plans, minimalloc-style.

    With ``capacity``, find any plan whose height is at most ``capacity`` (decision version);
    without it, minimise the height (``problem.capacity`` is not consulted: pass it explicitly
    to ask the decision question). ``initial``, a valid plan of ``problem``, seeds the search;
    it is returned unchanged when nothing better is found. ``node_limit`` stops it after that
    many search nodes in all (default
    :data:`~tensorarena.planning.budget.DEFAULT_NODE_LIMIT`; ``None``: no limit): a budget
    that gives the same answer on any machine. ``work_limit`` bounds it the same way in work
    units, which weigh a node by the problem's size
    (:func:`~tensorarena.planning.exact_work.node_work`; default
    :data:`~tensorarena.planning.budget.DEFAULT_WORK_LIMIT`; ``None``: no limit), so that
    large problems, whose nodes cost more, get fewer. ``time_limit`` is an outer bound in seconds
    (default ``inf``: none); the search checks the clock every few hundred nodes. A search
    stopped by either limit returns what it found, unproven, and ``stopped_by`` says which.
    ``gap`` stops the optimisation version at a plan within that relative gap of the best
    bound proven (0: search on until the plan is proven optimal); ``progress`` is called with a
    :class:`~tensorarena.planning.progress.Progress` as the search goes. ``params`` turns the
    search's techniques on and off (:class:`~tensorarena.planning.exact_params.SolverParams`).

    Raises :class:`~tensorarena.errors.InvalidArgumentError` for a bad time or node limit (or a
    ``problem`` that is not a :class:`Problem`), :class:`~tensorarena.errors.InvalidSizeError`
    for a bad capacity, and :class:`InvalidPlanError` for an ``initial`` plan that is not a
    valid plan of ``problem``.
    """
    check_problem(problem)
    capacity = check_capacity(capacity)
    seconds = check_time_limit(time_limit)
    nodes = check_node_limit(node_limit)
    work = check_node_limit(work_limit, name="work_limit")
    gap = check_gap(gap)
    check_progress(progress)
    check_int64(problem)
    check_point_pins(problem, "exact")
    if params is not None and not isinstance(params, SolverParams):
        raise InvalidArgumentError(f"params must be a SolverParams, got {type(params).__name__}")
    solver = Solver(params)
    # The clock starts before the seed is checked: validating a large plan takes a while.
    started = time.perf_counter()
    deadline = time.monotonic() + seconds
    if initial is not None:
        _check_initial(problem, initial)
    report = Reporter(progress, started, height=None if initial is None else initial.height)
    sections = build_sections(problem.buffers)
    limits = _Limits(started, deadline, node_budget(nodes, work, sections), gap, report, solver,
                     seconds, nodes, work, node_work(sections))
    if capacity is not None:
        return _decision(problem, sections, capacity, initial, limits)
    return _optimise(problem, sections, initial, limits)


def greedy_plan(problem: Problem) -> Plan:
    """Largest first (longer lifetime breaks ties), each at its lowest aligned free gap.

    The optimisation version's own starting point; heuristics proper live elsewhere. Pinned
    buffers stay at their pins.
    """
    check_problem(problem)
    check_int64(problem)
    check_point_pins(problem, "exact")
    sections = build_sections(problem.buffers)
    size = sections.size.tolist()
    align = sections.align.tolist()
    width = sections.width.tolist()
    overlaps = sections.overlaps
    n = len(sections)
    pin = sections.pin.tolist()
    # Pinned buffers first, at their pins: to the rest they are occupied space.
    order = sorted(range(n), key=lambda i: (pin[i] < 0, -size[i], -width[i], i))
    offsets = [-1] * n
    for i in order:
        if pin[i] >= 0:
            offsets[i] = pin[i]
            continue
        taken = sorted(
            (offsets[j], offsets[j] + size[j]) for j in overlaps[i].tolist() if offsets[j] >= 0
        )
        offset = 0
        for low, high in taken:
            if offset + size[i] <= low:
                break
            offset = max(offset, _align_up(high, align[i]))
        offsets[i] = offset
    return Plan(problem, _full_offsets(problem, sections, offsets), planner="exact:greedy")


# ---------------------------------------------------------------------------------------------
# The two versions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Limits:
    """When the search started (``perf_counter``), its deadline (``monotonic``), the nodes it
    may visit under both budgets, the gap that is good enough, where progress goes, the time
    limit, node limit and work limit as given, and the work units a node costs."""

    started: float
    deadline: float
    nodes: int | None
    gap: float
    report: Reporter
    solver: Solver
    seconds: float
    node_limit: int | None
    work_limit: int | None
    node_work: int

    def result(self, plan: Plan | None, *, feasible: bool, proven: bool, nodes: int,
               lower_bound: int, bound: int, stopped_by: StopReason) -> ExactResult:
        """The :class:`ExactResult`, with the time used and the limits it ran under."""
        return ExactResult(plan=plan, feasible=feasible, proven=proven, nodes=nodes,
                           seconds=time.perf_counter() - self.started, lower_bound=lower_bound,
                           bound=bound, stopped_by=stopped_by, node_limit=self.node_limit,
                           time_limit=self.seconds, work=nodes * self.node_work,
                           work_limit=self.work_limit)

    def nodes_left(self, spent: int) -> int | None:
        return None if self.nodes is None else self.nodes - spent

    def ticker(self, spent: int) -> Callable[[int], None] | None:
        """A heartbeat for :func:`decide` that adds the nodes ``spent`` before it (or None)."""
        if not self.report:
            return None
        report = self.report
        return lambda nodes: report.update("exact", nodes=spent + nodes, tick=True)


def _floor(problem: Problem, sections: Sections) -> int:
    """The best lower bound before searching: alignment padding counted, on the granule."""
    return _round_up(max(sections.peak(), aligned_lower_bound(problem)), sections.granule)


def _decision(
    problem: Problem,
    sections: Sections,
    capacity: int,
    initial: Plan | None,
    limits: _Limits,
) -> ExactResult:
    bound = sections.peak()
    floor = _floor(problem, sections)

    def result(plan: Plan | None, proven: bool, nodes: int, best: int = floor,
               stopped_by: StopReason = StopReason.PROVEN) -> ExactResult:
        limits.report.update("done", bound=best, nodes=nodes,
                             height=None if plan is None else plan.height)
        return limits.result(plan, feasible=plan is not None, proven=proven, nodes=nodes,
                             lower_bound=bound, bound=best, stopped_by=stopped_by)

    if initial is not None and initial.height <= capacity:
        optimal = initial.optimal or initial.height <= floor
        return result(_relabel(initial, initial.planner, optimal, 0, floor, limits), True, 0)
    if floor > capacity:
        return result(None, True, 0)
    limits.report.update("exact", bound=floor)
    found = limits.solver.solve(sections, capacity, deadline=limits.deadline,
                                node_limit=limits.nodes, on_tick=limits.ticker(0))
    if found.status == FOUND:
        assert found.offsets is not None
        offsets = _full_offsets(problem, sections, found.offsets.tolist())
        plan = Plan(problem, offsets, planner="exact")
        plan = _relabel(plan, "exact", plan.height <= floor, found.nodes, floor, limits)
        return result(plan, True, found.nodes)
    if found.status == EXHAUSTED:
        return result(None, True, found.nodes, _round_up(capacity + 1, sections.granule))
    late = StopReason.TIME_LIMIT if found.timed_out else StopReason.BUDGET
    return result(None, False, found.nodes, stopped_by=late)


def _optimise(
    problem: Problem,
    sections: Sections,
    initial: Plan | None,
    limits: _Limits,
) -> ExactResult:
    bound = sections.peak()
    granule = sections.granule
    # A caller's seed (typically the heuristic portfolio) is kept; only without one do we pay
    # for a greedy plan of our own.
    best = initial if initial is not None else greedy_plan(problem)
    # Every capacity below ``proven_low`` is proven infeasible; ``try_low`` is where the next
    # probe may start (above it when a probe at a lower capacity ran out of time).
    proven_low = try_low = _floor(problem, sections)
    report = limits.report
    report.update("exact", height=best.height, bound=proven_low)
    nodes = 0
    first = True
    stopped_by = StopReason.PROVEN
    while True:
        top = (best.height - 1) // granule * granule
        if proven_low > top:
            break
        if good_enough(best.height, proven_low, limits.gap):
            stopped_by = StopReason.GOOD_ENOUGH
            break
        remaining = limits.deadline - time.monotonic()
        nodes_left = limits.nodes_left(nodes)
        if nodes_left is not None and nodes_left <= 0:
            stopped_by = StopReason.BUDGET
            break
        if remaining <= 0:
            stopped_by = StopReason.TIME_LIMIT
            break
        if try_low > top:
            try_low = top  # everything below gave up before: give the last probe all that is left
        if try_low == top:
            probe, allowed = top, nodes_left
        else:
            # Real problems often meet the lower bound: it is asked first.
            probe = try_low if first else (try_low + top) // 2 // granule * granule
            allowed = PROBE_NODES if nodes_left is None else min(nodes_left, PROBE_NODES)
        first = False
        found = limits.solver.solve(sections, probe, deadline=limits.deadline,
                                    node_limit=allowed, on_tick=limits.ticker(nodes))
        nodes += found.nodes
        if found.status == FOUND:
            assert found.offsets is not None
            best = Plan(problem, _full_offsets(problem, sections, found.offsets.tolist()))
        elif found.status == EXHAUSTED:
            proven_low = try_low = max(try_low, probe + granule)
        else:
            try_low = probe + granule
        report.update("exact", height=best.height, bound=proven_low, nodes=nodes)
    proven = proven_low > (best.height - 1) // granule * granule
    planner = best.planner or "exact"
    report.update("done", nodes=nodes)
    if proven or best.optimal:
        stopped_by = StopReason.PROVEN
    return limits.result(
        _relabel(best, planner, proven or best.optimal, nodes, proven_low, limits, stopped_by),
        feasible=True, proven=proven or best.optimal, nodes=nodes, lower_bound=bound,
        bound=min(proven_low, best.height), stopped_by=stopped_by,
    )


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def check_point_pins(problem: Problem, planner: str) -> None:
    """Refuse a zero-byte buffer pinned above 0: the search leaves zero-byte buffers out, so it
    could not keep other buffers from straddling that point (:func:`validate`'s rule)."""
    for b in problem.buffers:
        if b.nbytes == 0 and b.offset:
            raise InvalidProblemError(
                f"planner {planner!r} cannot honour buffer {b.id!r}: a zero-byte buffer pinned "
                f"at {b.offset} (pin it at 0, or use a greedy planner)",
                column="offset",
            )


def _check_initial(problem: Problem, initial: Plan) -> None:
    if not isinstance(initial, Plan):
        raise InvalidPlanError(f"initial must be a Plan, got {type(initial).__name__}")
    if initial.problem.buffers != problem.buffers:
        raise InvalidPlanError("initial plan is for a different problem (its buffers differ)")
    validate(problem, initial, capacity=None)


def _relabel(
    plan: Plan, planner: str, optimal: bool, nodes: int, bound: int, limits: _Limits,
    stopped_by: StopReason = StopReason.PROVEN,
) -> Plan:
    peak = plan.problem.lower_bound()
    statistics = PlanStatistics(
        seconds=time.perf_counter() - limits.started, lower_bound=peak, nodes=nodes,
        bound=plan.height if optimal else max(bound, peak), stopped_by=stopped_by,
        node_limit=limits.node_limit, time_limit=limits.seconds,
        work=nodes * limits.node_work, work_limit=limits.work_limit,
    )
    return Plan(plan.problem, plan.offsets, planner=planner, optimal=optimal,
                statistics=statistics)


def _full_offsets(problem: Problem, sections: Sections, offsets: list[int]) -> tuple[int, ...]:
    """Offsets for every buffer: the searched ones from ``offsets``, zero-byte ones at 0 (where
    :func:`check_point_pins` lets their pins be)."""
    full = [0] * len(problem.buffers)
    for k, index in enumerate(sections.members):
        full[index] = int(offsets[k])
    return tuple(full)


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _round_up(value: int, granule: int) -> int:
    return -(-value // granule) * granule
