"""The minimum-cut bound on reordering: exact at every node against brute force over all orders,
never above the best order, and tighter than the forced-buffer bound where it matters."""

from __future__ import annotations

import itertools
import random

import pytest
from graph_checks import forced_live_bound

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import schedules
from tensorarena.planning.cut_bound import CutBound
from tensorarena.planning.op_graph import OpGraph
from tensorarena.planning.reorder import reorder


def dag(seed: int, n: int) -> OpGraph:
    """A random DAG whose nodes make zero to two buffers, each used by up to three later nodes
    (some unused, some graph outputs), with a few ordering-only edges."""
    rng = random.Random(seed)
    preds: list[set[int]] = [set() for _ in range(n)]
    uses: list[list[int]] = [[] for _ in range(n)]
    produces: list[tuple[int, ...]] = []
    sizes: list[int] = []
    for v in range(n):
        made = []
        for _ in range(rng.choice((0, 1, 1, 2)) if v < n - 1 else 0):
            b = len(sizes)
            made.append(b)
            sizes.append(rng.randint(1, 9) * 8)
            for u in rng.sample(range(v + 1, n), min(n - 1 - v, rng.randint(0, 3))):
                preds[u].add(v)
                uses[u].append(b)
        produces.append(tuple(made))
        if v and rng.random() < 0.2:
            preds[v].add(rng.randrange(v))
    return OpGraph(
        names=tuple(f"n{v}" for v in range(n)),
        preds=tuple(tuple(sorted(p)) for p in preds),
        produces=tuple(produces),
        uses=tuple(tuple(sorted(u)) for u in uses),
        buffer_ids=tuple(f"b{b}" for b in range(len(sizes))),
        sizes=tuple(sizes),
        outputs=frozenset(b for b in range(len(sizes)) if rng.random() < 0.15),
    )


def live_at_each_node(graph: OpGraph, order: tuple[int, ...]) -> dict[int, int]:
    """Live bytes while each node runs, buffer by buffer (independent of OpGraph.profile)."""
    pos = {v: k for k, v in enumerate(order)}
    producer = {b: v for v, made in enumerate(graph.produces) for b in made}
    live = {}
    for v in order:
        t = pos[v]
        total = 0
        for b, size in enumerate(graph.sizes):
            users = [pos[u] for u, used in enumerate(graph.uses) if b in used]
            end = len(order) if b in graph.outputs else max([pos[producer[b]], *users]) + 1
            total += size if pos[producer[b]] <= t < end else 0
        live[v] = total
    return live


def all_orders(graph: OpGraph) -> list[tuple[int, ...]]:
    return [p for p in itertools.permutations(range(len(graph)))
            if all(p.index(q) < p.index(v) for v in p for q in graph.preds[v])]


@pytest.mark.parametrize("seed", range(10))
def test_the_bound_at_each_node_is_the_fewest_bytes_any_order_has_live_there(seed: int) -> None:
    graph = dag(seed, 7)
    lives = [live_at_each_node(graph, order) for order in all_orders(graph)]
    cuts = CutBound(graph)
    for x in range(len(graph)):
        assert cuts.at(x) == min(live[x] for live in lives)
    optimum = min(max(live.values()) for live in lives)
    bound, complete = cuts.bound(schedules.bfs(graph))
    assert complete
    assert bound == max(cuts.at(x) for x in range(len(graph))) <= optimum
    assert bound >= forced_live_bound(graph)


def gelu_like() -> OpGraph:
    """Forward computes ``3 * x**2`` for the backward: at the loss one of ``x``, ``x**2`` or
    ``3 * x**2`` is live in every order, though no one of them must be."""
    return OpGraph(
        names=("x", "pow", "mul3", "f", "loss", "back"),
        preds=((), (0,), (1,), (0,), (3,), (2, 4)),
        produces=((0,), (1,), (2,), (3,), (4,), (5,)),
        uses=((), (0,), (1,), (0,), (3,), (2, 4)),
        buffer_ids=("X", "P", "M", "Y", "L", "G"),
        sizes=(64, 64, 64, 64, 8, 8),
        outputs=frozenset({5}),
    )


def test_the_cut_bound_proves_an_optimum_that_forced_buffers_miss() -> None:
    graph = gelu_like()
    optimum = min(max(live.values())
                  for live in (live_at_each_node(graph, o) for o in all_orders(graph)))
    assert forced_live_bound(graph) < optimum
    assert CutBound(graph).bound(list(range(len(graph))))[0] == optimum
    schedule = reorder(graph, time_limit=1.0, plan_time_limit=0.5).schedule
    assert schedule.bound == schedule.lower_bound == optimum
    assert schedule.optimal


def test_an_out_of_time_bound_is_still_a_bound() -> None:
    graph = dag(3, 40)
    order = schedules.lpmf(graph)
    bound, complete = CutBound(graph).bound(order, deadline=0.0)
    assert not complete and bound == 0
    full, complete = CutBound(graph).bound(order, floor=5)
    assert complete and 5 <= full <= graph.peak(order)


@pytest.mark.parametrize("seed", range(8))
def test_the_last_of_a_set_is_the_fewest_bytes_any_order_has_live_at_its_last(seed: int) -> None:
    graph = dag(50 + seed, 7)
    rng = random.Random(seed)
    members = set(rng.sample(range(len(graph)), 3))
    fewest = min(
        live_at_each_node(graph, order)[max(members, key=order.index)]
        for order in all_orders(graph)
    )
    assert CutBound(graph).last_of(members) == fewest


def two_gradients() -> OpGraph:
    """Two weight gradients (outputs), each from its own activation gradient: whichever is made
    last, the other is live, and so is that one's input."""
    return OpGraph(
        names=("grad_out", "wgrad1", "wgrad2"),
        preds=((), (0,), (0,)),
        produces=((0, 1), (2,), (3,)),
        uses=((), (0,), (1,)),
        buffer_ids=("A1", "A2", "G1", "G2"),
        sizes=(8, 8, 64, 64),
        outputs=frozenset({2, 3}),
    )


def test_the_last_output_made_proves_what_no_single_node_bound_can() -> None:
    graph = two_gradients()
    optimum = min(max(live.values())
                  for live in (live_at_each_node(graph, o) for o in all_orders(graph)))
    cuts = CutBound(graph)
    assert max(cuts.at(x) for x in range(len(graph))) < optimum == 136
    assert cuts.bound([0, 1, 2])[0] == optimum
    with pytest.raises(InvalidArgumentError, match="cannot run after"):
        cuts.at(0, run=[1])
