"""Memory-aware operator reordering: :func:`reorder` picks the order a graph's nodes run in.

The order sets every lifetime, so it sets the lower bound of the planning problem itself.
:func:`reorder` runs Inductor's three heuristics (LPMF, BFS, DFS: the baselines), improves the
best orders by a local search with exact windows around the peak, proves the optimum outright on
small graphs (:mod:`~tensorarena.planning.schedules`), and then puts the placement in the loop:
the few orders with the lowest peaks are planned, and the order whose *plan* is lowest wins.
Only orders that peak no higher than the graph as given and than the best of Inductor's
heuristics are planned, so the result is never above either. A minimum-cut bound
(:class:`~tensorarena.planning.cut_bound.CutBound`) says how low any order can go; the search
stops when it gets there, and the schedule says whether it is proven optimal.

The search over orders is bounded by a budget of work steps (``steps``, default
:data:`~tensorarena.planning.budget.DEFAULT_REORDER_STEPS`: an order scored, a max flow of the
bound, a state of an exact window), shared out among its stages by steps, not by seconds, so the
same graph gets the same order on any machine; ``time_limit`` is the outer bound, and
``Schedule.stopped_by`` says which ended it.

Every order goes through :func:`~tensorarena.planning.op_graph.check_order`, the independent
check, before it is planned. What comes back (:class:`Reordering`): the :class:`Schedule` (node
names in the order to run them, and the numbers), the planning problem of that order, its plan,
and, for an fx source, the reordered ``torch.fx.Graph`` (same nodes and metadata, new order),
which runs as the original does (the runtime's planned executor takes it like any graph).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import schedules
from tensorarena.planning.budget import (
    DEFAULT_REORDER_PLAN_NODES,
    DEFAULT_REORDER_PLAN_WORK,
    DEFAULT_REORDER_STEPS,
    StepBudget,
    StopReason,
)
from tensorarena.planning.cut_bound import CutBound
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.op_graph import OpGraph, check_order, op_graph_from_fx, reordered_graph
from tensorarena.planning.options import check_node_limit, check_time_limit
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.sizes import check_alignment

if TYPE_CHECKING:
    import torch.fx

__all__ = [
    "INDUCTOR_HEURISTICS", "OrderSearch", "Reordering", "Schedule", "reorder", "reorder_graph",
]

#: Inductor's topological-sort heuristics, by name (the baselines).
INDUCTOR_HEURISTICS = ("lpmf", "bfs", "dfs")
# Exact search over all orders up to this many nodes (states are capped besides).
_EXACT_NODES = 40
# Orders planned at the end, lowest peaks first: the placement decides among them.
_PLANNED = 3


@dataclass(frozen=True)
class Schedule:
    """An order for a graph's nodes and what it does to memory."""

    order: tuple[str, ...]  #: node names, in the order to run them
    method: str  #: what found it: "original", "lpmf", "bfs", "dfs", "local", "exact"
    lower_bound: int  #: peak of live bytes in this order (its problem's lower bound)
    original_lower_bound: int  #: the same for the order the graph was given in
    baselines: dict[str, int] = field(default_factory=dict)  #: Inductor's heuristics' peaks
    #: no order peaks lower (:class:`~tensorarena.planning.cut_bound.CutBound`)
    bound: int = 0
    optimal: bool = False  #: proven: no order has a lower peak (the bound, or exact search)
    seconds: float = 0.0
    stopped_by: StopReason = StopReason.NOT_RUN  #: what ended the search over orders
    steps: int = 0  #: work steps the search over orders used
    step_limit: int | None = None  #: its budget (None: none)

    @property
    def inductor_best(self) -> int:
        """The lowest peak of Inductor's three heuristics; the given order's peak
        (``original_lower_bound``) for a schedule made without them, the order Inductor
        would then run (so ``lower_bound <= inductor_best`` holds for a schedule that
        improves on its graph's order)."""
        return min(self.baselines.values(), default=self.original_lower_bound)


@dataclass(frozen=True, eq=False)
class Reordering:
    """:func:`reorder`'s answer: the schedule, its problem and plan, the reordered graph."""

    schedule: Schedule
    problem: GraphProblem | Problem  #: the planning problem of the new order
    plan: Plan  #: a plan of ``problem`` (the lowest of the orders tried)
    graph: torch.fx.Graph | None = None  #: the reordered fx graph, for an fx source

    @property
    def height(self) -> int:
        """The plan's height: the arena the reordered graph needs."""
        return self.plan.height


class OrderSearch(NamedTuple):
    """What :func:`reorder_graph` found (a tuple, so it also unpacks in this field order)."""

    #: (method, node indices) of every order found, lowest peak first, each checked
    candidates: list[tuple[str, list[int]]]
    baselines: dict[str, int]  #: Inductor's heuristics' peaks, by name
    proven: bool  #: no order peaks lower than the first candidate
    bound: int  #: the peak no order can go below (the minimum-cut bound)
    stopped_by: StopReason = StopReason.NOT_RUN  #: proof, budget, time limit, or complete
    steps: int = 0  #: work steps used (an order scored, a max flow, an exact state)


def reorder_graph(graph: OpGraph, *, time_limit: float = 60.0, seed: int = 0,
                  steps: int | None = DEFAULT_REORDER_STEPS) -> OrderSearch:
    """Search ``graph``'s orders for the lowest peak of live bytes (see the module doc);
    every order found is checked with :func:`~tensorarena.planning.op_graph.check_order`.
    ``steps`` is the work budget (``None``: none), ``time_limit`` the outer bound in seconds."""
    if not isinstance(graph, OpGraph):
        raise InvalidArgumentError(f"reorder_graph() takes an OpGraph, got {type(graph).__name__}")
    _check_seed(seed)
    budget = StepBudget(check_node_limit(steps, name="steps"))
    deadline = time.monotonic() + check_time_limit(time_limit)
    found: list[tuple[str, list[int]]] = [("original", list(range(len(graph))))]
    for name in INDUCTOR_HEURISTICS:
        found.append((name, getattr(schedules, name)(graph)))
    for _, order in found:
        check_order(graph, order)
    baselines = {name: graph.peak(order) for name, order in found[1:]}
    # The cut bound visits few nodes when given a low order; a quarter of the steps at most.
    lowest = min((order for _, order in found), key=graph.peak)
    cut_steps = budget.share(4)
    bound, _ = CutBound(graph).bound(lowest, deadline=deadline, steps=cut_steps)
    budget.spend(cut_steps.used)
    proven = graph.peak(lowest) <= bound
    if not proven and len(graph) <= _EXACT_NODES:
        best = schedules.exact(graph, deadline=deadline, steps=budget)
        if best is not None:
            check_order(graph, best)
            found.append(("exact", best))
            proven = True
    if not proven:
        starts = sorted(found, key=lambda item: graph.peak(item[1]))
        for k, (_, order) in enumerate(starts):
            share = budget.share(len(starts) - k)  # what earlier starts left, shared again
            improved = schedules.improve(graph, order, deadline=deadline, seed=seed + k,
                                         target=bound, steps=share)
            budget.spend(share.used)
            check_order(graph, improved)
            found.append(("local", improved))
            if graph.peak(improved) <= bound:
                proven = True
                break
    found.sort(key=lambda item: (graph.peak(item[1]), item[0] != "original"))
    if proven:
        stopped_by = StopReason.PROVEN
    elif budget.exhausted:
        stopped_by = StopReason.BUDGET
    elif time.monotonic() >= deadline:
        stopped_by = StopReason.TIME_LIMIT
    else:
        stopped_by = StopReason.COMPLETE
    return OrderSearch(found, baselines, proven, bound, stopped_by, budget.used)


def reorder(source: Any, *, time_limit: float = 60.0, plan_time_limit: float = 2.0,
            alignment: int = 64, seed: int = 0,
            steps: int | None = DEFAULT_REORDER_STEPS,
            plan_node_limit: int | None = DEFAULT_REORDER_PLAN_NODES,
            plan_work_limit: int | None = DEFAULT_REORDER_PLAN_WORK) -> Reordering:
    """Choose the order to run ``source``'s nodes in (see the module doc).

    ``source`` is an :class:`~tensorarena.planning.op_graph.OpGraph`, a ``torch.fx``
    ``GraphModule`` (from ``make_fx`` or :func:`~tensorarena.planning.trace_training`) or a
    ``torch.export`` ``ExportedProgram``. ``steps`` is the search over orders' budget of work
    steps (``None``: none), the same on any machine; ``time_limit`` bounds it in seconds,
    ``plan_time_limit`` each plan made at the end, which also shares what the search leaves
    unused when it proves its order optimal early (a plan stops when it reaches its bound, and
    the portfolio behind :func:`~tensorarena.planning.plan` reaches it sooner given more time:
    ``bench/RESULTS.md``); ``plan_node_limit`` and ``plan_work_limit`` are each plan's budgets
    (:func:`~tensorarena.planning.plan`'s ``node_limit`` and ``work_limit``), which end the
    plans, and so the choice among the orders, the same way on any machine;
    ``alignment`` is every buffer's.
    """
    # Every option is checked before the graph is read or searched: a bad one raises at once,
    # not after the whole search has run.
    check_time_limit(time_limit)
    check_time_limit(plan_time_limit, name="plan_time_limit")
    check_node_limit(steps, name="steps")
    check_node_limit(plan_node_limit, name="plan_node_limit")
    check_node_limit(plan_work_limit, name="plan_work_limit")
    check_alignment(alignment)
    _check_seed(seed)
    started = time.perf_counter()
    graph_of, rebuild = _adapt(source, alignment)
    searched = time.monotonic()
    search = reorder_graph(graph_of, time_limit=time_limit, seed=seed, steps=steps)
    candidates, baselines, proven, bound = search[:4]
    # What the search left unused, shared by the plans; none when unlimited: time_limit=inf
    # asks for an unbounded search over orders, not for plans that may never stop.
    unused = time_limit - (time.monotonic() - searched)
    spare = max(0.0, unused) / _PLANNED if math.isfinite(unused) else 0.0
    original = graph_of.peak(list(range(len(graph_of))))
    ceiling = min(original, *baselines.values())
    from tensorarena.planning.planners import plan

    best: tuple[int, int, str, list[int], Any, Plan] | None = None
    seen: set[tuple[int, ...]] = set()
    for method, order in candidates:
        if len(seen) >= _PLANNED:
            break
        if tuple(order) in seen or graph_of.peak(order) > ceiling:
            continue  # a lower plan must not buy a higher peak than Inductor's or the given one
        seen.add(tuple(order))
        problem, graph = rebuild(order)
        planned = plan(problem.problem if isinstance(problem, GraphProblem) else problem,
                       time_limit=plan_time_limit + spare, node_limit=plan_node_limit,
                       work_limit=plan_work_limit)
        key = (planned.height, graph_of.peak(order))
        if best is None or key < best[:2]:
            best = (*key, method, order, (problem, graph), planned)
        if planned.height <= graph_of.peak(candidates[0][1]):
            break  # at the lowest peak of all: no other order can plan lower
    assert best is not None
    _, peak, method, order, (problem, graph), planned = best
    schedule = Schedule(
        order=tuple(graph_of.names[v] for v in order), method=method, lower_bound=peak,
        original_lower_bound=original, baselines=baselines, bound=bound,
        optimal=peak <= bound or (proven and peak == graph_of.peak(candidates[0][1])),
        seconds=time.perf_counter() - started, stopped_by=search.stopped_by,
        steps=search.steps, step_limit=steps,
    )
    return Reordering(schedule, problem, planned, graph)


_TAKES = "reorder() takes an OpGraph, a torch.fx.GraphModule or a torch.export ExportedProgram"


def _check_seed(seed: object) -> None:
    if type(seed) is not int:
        raise InvalidArgumentError(f"seed must be an int, got {type(seed).__name__} {seed!r}")


def _adapt(source: Any, alignment: int) -> tuple[OpGraph, Any]:
    """The OpGraph of ``source`` and a function from an order to (problem, fx graph or None)."""
    if isinstance(source, OpGraph):
        def from_lifetimes(order: list[int]) -> tuple[Problem, None]:
            start, end = source.lifetimes(order)
            buffers = (Buffer(b, int(s), int(e), size, alignment) for b, s, e, size in
                       zip(source.buffer_ids, start, end, source.sizes, strict=True))
            return Problem(buffers), None

        return source, from_lifetimes
    if isinstance(source, (GraphProblem, Problem)):  # refused without torch, too
        raise InvalidArgumentError(
            f"{_TAKES}, got {type(source).__name__}: a planning problem has the lifetimes of "
            "one order, not the dependencies that say which other orders are valid; pass the "
            "graph it was made from"
        )
    from tensorarena._optional import require

    th = require("torch", extra="torch", feature="reordering PyTorch graphs")
    from tensorarena.planning.torch_frontend import problem_from_exported, problem_from_fx

    if isinstance(source, th.export.ExportedProgram):
        program = source
        graph = program.graph

        def problem_of(new: torch.fx.Graph) -> GraphProblem:
            return problem_from_exported(program, alignment=alignment, graph=new)
    elif isinstance(source, th.fx.GraphModule):
        module = source
        graph = module.graph

        def problem_of(new: torch.fx.Graph) -> GraphProblem:
            if new is graph:
                return problem_from_fx(module, alignment=alignment)
            return problem_from_fx(th.fx.GraphModule(module, new), alignment=alignment)
    else:
        raise InvalidArgumentError(f"{_TAKES}, got {type(source).__name__}")
    op_graph = op_graph_from_fx(graph, problem_of(graph))

    def rebuild(order: list[int]) -> tuple[GraphProblem, torch.fx.Graph]:
        new = reordered_graph(graph, [op_graph.names[v] for v in order])
        return problem_of(new), new

    return op_graph, rebuild
