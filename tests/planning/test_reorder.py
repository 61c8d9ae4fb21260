"""Memory-aware reordering: orders that keep every dependency, peaks against brute force, and
reordered graphs that run with equal outputs."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from graph_checks import forced_live_bound

from tensorarena.errors import InvalidAlignmentError, InvalidArgumentError, InvalidProblemError
from tensorarena.planning import schedules
from tensorarena.planning.budget import DEFAULT_REORDER_STEPS, StopReason
from tensorarena.planning.cut_bound import CutBound
from tensorarena.planning.op_graph import OpGraph, check_order, with_node_buffers
from tensorarena.planning.random_graphs import random_op_graph as random_graph
from tensorarena.planning.reorder import Schedule, reorder, reorder_graph
from tensorarena.planning.validate import validate


def topological_orders(graph: OpGraph) -> list[list[int]]:
    return [list(p) for p in itertools.permutations(range(len(graph)))
            if all(p.index(q) < p.index(v) for v in p for q in graph.preds[v])]


def brute_force_peak(graph: OpGraph, order: list[int]) -> int:
    """Live bytes at each step, buffer by buffer, written independently of OpGraph.profile."""
    pos = {v: k for k, v in enumerate(order)}
    peak = 0
    for step in range(len(order)):
        live = 0
        for b, size in enumerate(graph.sizes):
            producer = next(v for v, made in enumerate(graph.produces) if b in made)
            users = [pos[v] for v, used in enumerate(graph.uses) if b in used]
            end = len(order) if b in graph.outputs else max([pos[producer], *users]) + 1
            live += size if pos[producer] <= step < end else 0
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("seed", range(12))
def test_every_heuristic_gives_a_valid_order_and_the_exact_one_the_lowest(seed: int) -> None:
    graph = random_graph(seed, 7)
    orders = topological_orders(graph)
    optimum = min(brute_force_peak(graph, o) for o in orders)
    for method in (schedules.lpmf, schedules.bfs, schedules.dfs):
        order = method(graph)
        check_order(graph, order)
        assert graph.peak(order) == brute_force_peak(graph, order) >= optimum
    exact = schedules.exact(graph)
    assert exact is not None
    check_order(graph, exact)
    assert graph.peak(exact) == optimum
    assert forced_live_bound(graph) <= optimum
    improved = schedules.improve(graph, schedules.bfs(graph), deadline=float("inf"), seed=seed)
    check_order(graph, improved)
    assert optimum <= graph.peak(improved) <= graph.peak(schedules.bfs(graph))


@pytest.mark.parametrize("seed", range(8))
def test_an_exact_window_is_the_best_order_of_its_nodes(seed: int) -> None:
    graph = random_graph(100 + seed, 12)
    order = schedules.dfs(graph)
    lo, hi = 3, 9
    inner = schedules.exact_window(graph, order, lo, hi)
    assert inner is not None and sorted(inner) == sorted(order[lo:hi])
    best = min(
        graph.peak(order[:lo] + list(p) + order[hi:])
        for p in itertools.permutations(order[lo:hi])
        if _valid(graph, order[:lo] + list(p) + order[hi:])
    )
    check_order(graph, order[:lo] + inner + order[hi:])
    assert graph.peak(order[:lo] + inner + order[hi:]) == best


def _valid(graph: OpGraph, order: list[int]) -> bool:
    try:
        check_order(graph, order)
    except InvalidArgumentError:
        return False
    return True


def test_a_cycle_or_a_broken_order_is_refused() -> None:
    with pytest.raises(InvalidProblemError, match="cycle"):
        OpGraph(names=("a", "b"), preds=((1,), (0,)), produces=((0,), (1,)), uses=((), ()),
                buffer_ids=("x", "y"), sizes=(4, 4), outputs=frozenset())
    graph = random_graph(1, 5)
    with pytest.raises(InvalidArgumentError, match="depends on"):
        check_order(graph, [4, 3, 2, 1, 0])
    with pytest.raises(InvalidArgumentError, match="node 'n0' runs twice"):
        check_order(graph, [0, 0, 1, 2, 3])
    with pytest.raises(InvalidArgumentError, match="OpGraph"):
        reorder("graph")  # type: ignore[arg-type]


def test_a_schedule_made_without_baselines_compares_with_the_given_order() -> None:
    # inductor_best used to raise min()'s ValueError ("empty sequence") here.
    schedule = Schedule(order=("a", "b"), method="original", lower_bound=96,
                        original_lower_bound=128)
    assert schedule.inductor_best == 128
    measured = Schedule(order=("a", "b"), method="lpmf", lower_bound=96,
                        original_lower_bound=128, baselines={"lpmf": 96, "bfs": 112})
    assert measured.inductor_best == 96


def test_reorder_an_op_graph_never_worse_than_inductor() -> None:
    graph = random_graph(7, 60)
    result = reorder(graph, time_limit=1.0, plan_time_limit=0.5)
    schedule = result.schedule
    assert schedule.lower_bound <= schedule.inductor_best
    assert schedule.lower_bound <= schedule.original_lower_bound
    assert schedule.bound <= schedule.lower_bound
    assert set(schedule.baselines) == {"lpmf", "bfs", "dfs"}
    order = [int(name[1:]) for name in schedule.order]
    check_order(graph, order)
    assert result.problem.lower_bound() == graph.peak(order) == schedule.lower_bound
    validate(result.problem, result.plan)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Real graphs: equal outputs
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def training_graph() -> tuple[Any, Any, list[Any]]:
    torch = pytest.importorskip("torch")
    from tensorarena.planning.torch_frontend import trace_training

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.LayerNorm(32),
                          nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
    model.train()
    x = torch.randn(8, 16)
    gm = trace_training(model, (x,))
    # make_fx keeps trace_training's calling convention: parameters, buffers, args, kwargs.
    inputs = [list(model.parameters()), list(model.buffers()), (x,), {}]
    return torch, gm, inputs


@pytest.mark.torch
def test_a_reordered_training_graph_runs_with_equal_outputs(
    training_graph: tuple[Any, Any, list[Any]],
) -> None:
    torch, gm, flat = training_graph
    from tensorarena.planning.op_graph import op_graph_from_fx
    from tensorarena.planning.torch_frontend import problem_from_fx

    problem = problem_from_fx(gm)
    graph = op_graph_from_fx(gm.graph, problem)
    start, end = graph.lifetimes(list(range(len(graph))))
    assert [(b.start, b.end) for b in problem.problem.buffers] == list(
        zip(start.tolist(), end.tolist(), strict=True))
    result = reorder(gm, time_limit=1.0, plan_time_limit=0.5)
    assert result.graph is not None
    assert [n.name for n in result.graph.nodes] == list(result.schedule.order)
    # Equal outputs prove something only if the order moved (52 of 65 nodes here, 10836 ->
    # 8776 live bytes at the peak): the original order would pass trivially.
    assert result.schedule.order != tuple(n.name for n in gm.graph.nodes)
    assert result.schedule.lower_bound < result.schedule.original_lower_bound
    reordered = torch.fx.GraphModule(gm, result.graph)
    # The front end's problem of the new graph is the one the search scored.
    assert result.problem.lower_bound() == result.schedule.lower_bound
    validate(result.problem.problem, result.plan)
    torch.manual_seed(1)
    expected = gm(*flat)
    torch.manual_seed(1)  # dropout draws the same numbers: random nodes keep their order
    got = reordered(*flat)
    for a, b in zip(torch.utils._pytree.tree_leaves(expected),
                    torch.utils._pytree.tree_leaves(got), strict=True):
        assert torch.equal(a, b)


@pytest.mark.torch
def test_the_planned_executor_runs_a_reordered_graph(
    training_graph: tuple[Any, Any, list[Any]],
) -> None:
    torch, gm, flat = training_graph
    runtime = pytest.importorskip("tensorarena.runtime")
    result = reorder(gm, time_limit=0.5, plan_time_limit=0.5)
    assert result.schedule.order != tuple(n.name for n in gm.graph.nodes)  # else trivial
    reordered = torch.fx.GraphModule(gm, result.graph)
    program = runtime.PlannedProgram.from_graph_module(reordered)
    torch.manual_seed(2)
    expected = gm(*flat)
    torch.manual_seed(2)
    got = program(*flat)
    for a, b in zip(torch.utils._pytree.tree_leaves(expected),
                    torch.utils._pytree.tree_leaves(got), strict=True):
        assert torch.allclose(a, b)


def test_lifetimes_follow_the_order() -> None:
    graph = random_graph(3, 6)
    order = schedules.lpmf(graph)
    start, end = graph.lifetimes(order)
    pos = np.empty(6, np.int64)
    pos[order] = np.arange(6)
    for b in range(6):
        users = [pos[v] for v, used in enumerate(graph.uses) if b in used]
        assert start[b] == pos[b]
        assert end[b] == (6 if b in graph.outputs else max([pos[b], *users]) + 1)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"plan_time_limit": "2"}, InvalidArgumentError, "plan_time_limit"),
        ({"plan_time_limit": -1.0}, InvalidArgumentError, "plan_time_limit"),
        ({"seed": "x"}, InvalidArgumentError, "seed"),
        ({"seed": 1.5}, InvalidArgumentError, "seed"),
        ({"seed": None}, InvalidArgumentError, "seed"),
        ({"alignment": 3}, InvalidAlignmentError, "alignment"),
        ({"time_limit": float("nan")}, InvalidArgumentError, "time_limit"),
        ({"plan_node_limit": -1}, InvalidArgumentError, "plan_node_limit"),
        ({"plan_work_limit": 2.5}, InvalidArgumentError, "plan_work_limit"),
    ],
)
def test_reorder_refuses_a_bad_option_before_searching(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    # A 60-node graph: seed="x" reached the local search's seed + k (TypeError) only here, and
    # plan_time_limit="2" the plan at the end, after the whole search.
    graph = random_graph(1, 60)
    with pytest.raises(error, match=match):
        reorder(graph, **{"time_limit": 0.2, **options})


def test_reorder_graph_names_what_it_found_against_brute_force() -> None:
    graph = random_graph(3, 7)
    found = reorder_graph(graph, time_limit=1.0)
    best = min(brute_force_peak(graph, order) for order in topological_orders(graph))
    peaks = [graph.peak(order) for _, order in found.candidates]
    assert peaks == sorted(peaks) and peaks[0] == best  # seven nodes: exact search proves it
    assert found.proven and found.bound <= best
    assert set(found.baselines) == {"lpmf", "bfs", "dfs"}
    assert all(found.baselines[name] == graph.peak(order)
               for name, order in found.candidates if name in found.baselines)
    # Still a tuple in its old field order, with what ended the search and the steps after.
    candidates, baselines, proven, bound, stopped_by, steps = found
    assert (candidates, baselines, proven, bound) == tuple(found)[:4]
    assert stopped_by is StopReason.PROVEN and 0 < steps <= DEFAULT_REORDER_STEPS


def test_reorder_graph_refuses_what_is_not_an_op_graph_or_a_bad_seed() -> None:
    with pytest.raises(InvalidArgumentError, match="OpGraph"):
        reorder_graph("graph")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="seed"):
        reorder_graph(random_graph(1, 60), time_limit=0.2, seed="x")  # type: ignore[arg-type]


def _two_nodes(**fields: Any) -> OpGraph:
    given: dict[str, Any] = {
        "names": ("a", "b"), "preds": ((), (0,)), "produces": ((0,), (1,)), "uses": ((), (0,)),
        "buffer_ids": ("x", "y"), "sizes": (16, 16), "outputs": frozenset({1}),
    }
    return OpGraph(**{**given, **fields})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"produces": ((0,), (-1,))}, "node 'b' produces -1"),  # read as buffer 1 from the end
        ({"produces": ((0,), (7,))}, "node 'b' produces 7"),  # IndexError
        ({"uses": ((), (7,))}, "node 'b' uses 7"),  # IndexError
        ({"uses": ((), ("x",))}, "node 'b' uses 'x'"),
        ({"preds": ((), ("a",))}, "node 'b' depends on 'a'"),  # TypeError
        ({"outputs": frozenset({9})}, "output 9"),
        ({"sizes": (-16, 16)}, "buffer 'x': size"),
        ({"sizes": ("16", 16)}, "buffer 'x': size"),
        ({"names": ("a", "a")}, "node name 'a'"),
        ({"buffer_ids": ("x", "x")}, "buffer name 'x'"),
    ],
)
def test_an_op_graph_refuses_indices_that_are_not_nodes_or_buffers(
    fields: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidProblemError, match=match):
        _two_nodes(**fields)
    assert _two_nodes().peak([0, 1]) == 32


@pytest.mark.parametrize(
    ("order", "match"),
    [
        ([0, 1, 2], "node 'n3' never runs"),
        ([0, 1, 2, 3, 4, 5, 6, 99], "step 7 is 99, not a node"),
        ([0, 1, 2, 3, 4, 5, 6, -1], "step 7 is -1, not a node"),
        ([True, 1, 2, 3, 4, 5, 6, 7], "step 0 is True"),
        (["n0"] * 8, "step 0 is 'n0'"),
        (None, "order must be a sequence"),  # TypeError
        ("n0", "order must be a sequence"),
    ],
)
def test_check_order_names_what_is_wrong(order: Any, match: str) -> None:
    graph = random_graph(0, 8)
    with pytest.raises(InvalidArgumentError, match=match):
        check_order(graph, order)
    with pytest.raises(InvalidArgumentError, match=match):
        CutBound(graph).bound(order)  # a ValueError from NumPy's profile, or a wrong bound
    check_order(graph, np.arange(8, dtype=np.int32))  # NumPy's ints are indices too


def test_check_order_and_cut_bound_refuse_what_is_not_an_op_graph() -> None:
    with pytest.raises(InvalidArgumentError, match="OpGraph"):
        check_order("graph", [0])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="OpGraph"):
        CutBound("graph")  # type: ignore[arg-type]


def test_successors_and_the_topological_order_follow_the_dependencies() -> None:
    graph = random_graph(5, 30)
    check_order(graph, graph.topological_order)
    for v, after in enumerate(graph.successors):
        assert sorted(after) == [s for s in range(len(graph)) if v in graph.preds[s]]


def test_an_unlimited_search_over_orders_still_bounds_each_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorarena.planning import planners

    limits: list[float] = []
    real_plan = planners.plan

    def recording_plan(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["time_limit"])
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(planners, "plan", recording_plan)
    reorder(random_graph(0, 30), time_limit=float("inf"), plan_time_limit=0.5)
    assert limits and all(limit == 0.5 for limit in limits)  # was inf: plans without end


def test_a_planning_problem_is_refused_with_what_to_pass_instead() -> None:
    from tensorarena.planning import Buffer, Problem

    with pytest.raises(InvalidArgumentError, match="pass the graph it was made from"):
        reorder(Problem([Buffer("a", 0, 1, 8)]))  # type: ignore[arg-type]


def _conv_late() -> OpGraph:
    """h (8 bytes; a convolution whose scratch is given separately), u (8), m = f(u) (1), the
    output y = g(h, m) (2): without scratch the best order makes h late, after u has died."""
    return OpGraph(names=("h", "u", "m", "y"), preds=((), (), (1,), (0, 2)),
                   produces=((0,), (1,), (2,), (3,)), uses=((), (), (1,), (0, 2)),
                   buffer_ids=("H", "U", "M", "Y"), sizes=(8, 8, 1, 2), outputs=frozenset({3}))


def test_a_node_buffer_changes_which_order_is_best() -> None:
    graph = _conv_late()
    plain = reorder_graph(graph, time_limit=1.0)
    assert [graph.names[v] for v in plain.candidates[0][1]] == ["u", "m", "h", "y"]
    assert graph.peak(plain.candidates[0][1]) == 11 < graph.peak([0, 1, 2, 3]) == 17
    local = with_node_buffers(graph, {"h": 72, "u": 0})
    assert local.buffer_ids[-1] == "h#local" and len(local.buffer_ids) == 5  # a zero adds none
    start, end = local.lifetimes([0, 1, 2, 3])
    assert (start[-1], end[-1]) == (0, 1)  # live only while its node runs
    found = reorder_graph(local, time_limit=1.0)
    # 72 bytes of scratch where m is live cost 1 byte more than where nothing else is
    assert [graph.names[v] for v in found.candidates[0][1]] == ["h", "u", "m", "y"]
    assert local.peak(found.candidates[0][1]) == 80 < local.peak(plain.candidates[0][1]) == 81
    assert found.proven


@pytest.mark.parametrize(("sizes", "match"), [
    ({"x": 4}, "'x' is not a node"), ({"h": -1}, "non-negative int"), ({"h": 1.5}, "int"),
])
def test_with_node_buffers_refuses_unknown_nodes_and_bad_sizes(sizes: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        with_node_buffers(_conv_late(), sizes)
    with pytest.raises(InvalidArgumentError, match="takes an OpGraph"):
        with_node_buffers("graph", {})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Work budgets: the same order on any machine
# ---------------------------------------------------------------------------------------------


def test_two_generous_time_limits_give_the_same_orders_and_steps() -> None:
    graph = random_graph(5, 60)
    runs = [reorder_graph(graph, time_limit=limit, steps=3_000) for limit in (60.0, float("inf"))]
    first, second = runs
    assert first.candidates == second.candidates and first.steps == second.steps
    assert first.stopped_by is second.stopped_by
    assert first.stopped_by in (StopReason.BUDGET, StopReason.PROVEN, StopReason.COMPLETE)
    for _, order in first.candidates:
        check_order(graph, order)


def test_a_tiny_step_budget_ends_the_search_by_budget_and_says_so() -> None:
    graph = random_graph(5, 60)
    found = reorder_graph(graph, time_limit=float("inf"), steps=3)
    if found.proven:  # the baselines met the cut bound: nothing to search
        pytest.skip("this graph needs no search")
    assert found.stopped_by is StopReason.BUDGET and found.steps >= 3  # one unit of work past
    for _, order in found.candidates:
        check_order(graph, order)


def test_a_tiny_time_limit_says_time_ended_the_reordering() -> None:
    graph = random_graph(5, 60)
    found = reorder_graph(graph, time_limit=0.0)
    assert not found.proven and found.stopped_by is StopReason.TIME_LIMIT
    result = reorder(graph, time_limit=0.0, steps=5)
    validate(result.problem, result.plan)
    assert result.schedule.stopped_by is StopReason.TIME_LIMIT
    assert result.schedule.step_limit == 5


@pytest.mark.parametrize("bad", [-1, 2.5, "many"])
def test_a_bad_step_budget_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="steps"):
        reorder_graph(random_graph(1, 10), steps=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="steps"):
        reorder(random_graph(1, 10), steps=bad)  # type: ignore[arg-type]


def test_the_plans_that_choose_the_order_end_by_their_budget_under_any_clock() -> None:
    # The plans at the end pick among the orders: ended by the clock (plan_time_limit), they
    # picked by the machine's speed. This graph's plan needs a search (296 nodes to a proof).
    graph = random_graph(2, 40)
    runs = [reorder(graph, steps=2_000, plan_time_limit=limit, plan_node_limit=5)
            for limit in (30.0, float("inf"))]
    for run in runs:
        validate(run.problem, run.plan)
        statistics = run.plan.statistics
        assert statistics is not None and statistics.stopped_by is StopReason.BUDGET
        assert statistics.nodes == statistics.node_limit == 5
    first, second = runs
    assert first.schedule.order == second.schedule.order
    assert first.plan.offsets == second.plan.offsets
    done = reorder(graph, steps=2_000, plan_node_limit=None, plan_work_limit=None)
    assert done.plan.statistics is not None
    assert done.plan.statistics.stopped_by is StopReason.PROVEN
