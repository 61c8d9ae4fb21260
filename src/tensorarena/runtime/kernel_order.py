"""The order a program runs in, chosen again once its kernels' own allocations are known.

``reorder=True`` picks an order at construction, from the graph alone: the allocations kernels
make inside a node (im2col columns, layer norm's copies) are known only after the first call of
a shape records them (:mod:`~tensorarena.runtime.kernel_recording`), and they are planned in
the arena beside whatever is live at their node. An order that runs a convolution's backward
where activations are still live pays its columns on top of them (Whisper's tiny training step had a
larger arena in the order reorder chose than in the traced one: ``bench/RESULTS.md``).

So after the first recorded call :func:`choose_order` compares, with the recorded allocations
included, the order running, the traced order, reorder's own order (when the program kept the
traced one) and the best orders of a new search in which every node's scratch is a buffer of
its own (:func:`~tensorarena.planning.op_graph.with_node_buffers`). Each is judged by the lower
bound of the problem the program would plan in that order, rewrites and kernel allocations
included (:func:`estimated_peak`; plus the peak of fresh outputs when they stay out of the
arena, which is held whole meanwhile); the order running wins ties. The choice is made once per
program, on the first shape recorded, and every shape runs it: the order is the graph's, shared
by all the shapes the program caches, and a switch drops them all (each is planned and recorded
again in the new order at its next call).

A kernel's allocations are taken to be the same in every order (they depend on the op and its
shapes); a node rewritten to run in place in one order and not in another may allocate
differently, so the estimate can be off by those few buffers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tensorarena.planning.problem import Buffer, lower_bound
from tensorarena.runtime.kernel_arena import KERNEL_TAG, KernelRecording, temporaries
from tensorarena.runtime.run_graph import ProblemOf, RunGraph, prepare
from tensorarena.runtime.shape_plans import classify_nodes
from tensorarena.runtime.specialization import planned_problem

if TYPE_CHECKING:
    from tensorarena.planning.op_graph import OpGraph
    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.specialization import Specialization

__all__ = ["choose_order", "estimated_peak", "scratch_by_node"]

#: Orders of the new search compared besides the known ones (lowest peaks first).
SEARCHED = 2


def scratch_by_node(recording: KernelRecording, in_slots: Mapping[str, str]) -> dict[str, int]:
    """Per node, the most bytes its kernels held at once in allocations freed within it (those
    served in a result's slot, ``in_slots``, need none of their own)."""
    found: dict[str, int] = {}
    for node, log in recording.logs.items():
        held = [Buffer(f"{node}{KERNEL_TAG}{k}", made, freed, nbytes)
                for k, (nbytes, made, freed, _) in enumerate(log)
                if freed is not None and nbytes > 0 and f"{node}{KERNEL_TAG}{k}" not in in_slots]
        peak = lower_bound(held)
        if peak:
            found[node] = peak
    return found


def estimated_peak(compiler: Compiler, run: RunGraph, bindings: Mapping[Any, int],
                   recording: KernelRecording, in_slots: Mapping[str, str]) -> int:
    """The lower bound of what ``program`` would plan for ``bindings`` running ``run``, with the
    recorded kernel allocations of its nodes as buffers (:func:`temporaries`), plus the peak of
    the buffers left out of the arena (fresh outputs and the like) when the outputs are fresh."""
    graph = run.problem_of(bindings)
    lowering = classify_nodes(compiler, graph, run)
    planned = planned_problem(graph, lowering)
    steps = {node.name: i for i, node in enumerate(run.graph.nodes)}
    ids = {b.id for b in planned.buffers}
    logs = KernelRecording({node: log for node, log in recording.logs.items() if node in steps})
    slots = {kernel: slot for kernel, slot in in_slots.items()
             if kernel.split(KERNEL_TAG)[0] in steps and slot in ids}
    problem, ticks = temporaries(logs, steps, planned, slots)
    peak = lower_bound(problem)
    if compiler.outputs == "fresh":
        peak += lower_bound([Buffer(b.id, b.start * ticks, b.end * ticks, b.nbytes)
                             for b in graph.problem.buffers if b.id in lowering.dynamic])
    return peak


def choose_order(compiler: Compiler, current: Specialization,
                 recording: KernelRecording, in_slots: Mapping[str, str]) -> bool:
    """Compare the orders (module docstring) for ``current``'s shape and make ``program`` run
    the lowest; return whether it now runs another order than the one ``current`` ran."""
    given, compiler.given = compiler.given, None  # chosen once: only the running graph stays
    scratch = scratch_by_node(recording, in_slots)
    if not scratch or given is None:
        return False  # nothing recorded changes the orders' peaks: the choice made stands
    started = time.perf_counter()
    given_gm, given_problem_of = given
    runs: dict[str, RunGraph] = {"running": compiler.run}

    def run_of(order: Iterable[str]) -> RunGraph:
        from tensorarena.planning.op_graph import reordered_graph
        from tensorarena.runtime.reordering import with_graph

        new = reordered_graph(given_gm.graph, list(order))
        new._codegen = given_gm.graph._codegen
        return prepare(with_graph(given_gm, new), given_problem_of, inplace=compiler.inplace)

    if compiler.reordered:
        runs["traced"] = prepare(given_gm, given_problem_of, inplace=compiler.inplace)
    elif compiler.schedule is not None:
        runs["reorder"] = run_of(compiler.schedule.order)
    ops, searched = _searched(compiler, (given_gm, given_problem_of), current.bindings,
                              scratch)
    known = {_given_order(run, given_gm) for run in runs.values()}
    added = 0
    for method, order in searched:
        if order not in known and added < SEARCHED:
            known.add(order)
            added += 1
            runs[f"searched {added} ({method})"] = run_of(order)
    estimates = {label: estimated_peak(compiler, run, current.bindings, recording, in_slots)
                 for label, run in runs.items()}
    best = min(estimates, key=estimates.__getitem__)  # first of the lowest: running on ties
    compiler.order_estimates = estimates
    if estimates[best] >= estimates["running"]:
        return False
    compiler.adopt(runs[best])
    compiler.reordered = best != "traced"
    if best.startswith("searched"):  # the schedule's numbers stay those of tensors alone
        order = _given_order(runs[best], given_gm)
        index = {name: v for v, name in enumerate(ops.names)}
        compiler.schedule = dataclasses.replace(
            compiler.schedule, order=order,
            method=f"{best.split('(')[1].rstrip(')')} with kernel scratch",
            lower_bound=ops.peak([index[name] for name in order]), optimal=False,
            seconds=compiler.schedule.seconds + time.perf_counter() - started)
    return True


def _given_order(run: RunGraph, given_gm: Any) -> tuple[str, ...]:
    """``run``'s order of the given graph's nodes (without the copies the program inserted)."""
    names = {node.name for node in given_gm.graph.nodes}
    return tuple(name for name in run.order if name in names)


def _searched(compiler: Compiler, given: tuple[Any, ProblemOf], bindings: Mapping[Any, int],
              scratch: Mapping[str, int]) -> tuple[OpGraph, list[tuple[str, tuple[str, ...]]]]:
    """The given graph's :class:`OpGraph` and the orders of a search over it whose cost counts
    every node's scratch (method, node names), lowest peak first."""
    from tensorarena.planning.op_graph import op_graph_from_fx, with_node_buffers
    from tensorarena.planning.reorder import reorder_graph
    from tensorarena.runtime.inplace import hints
    from tensorarena.runtime.reordering import REORDER_TIME_LIMIT

    given_gm, given_problem_of = given
    graph = given_gm.graph
    ops = op_graph_from_fx(graph, given_problem_of(graph, bindings or hints(graph)))
    names = set(ops.names)
    local = with_node_buffers(ops, {n: nbytes for n, nbytes in scratch.items() if n in names})
    limit = max(compiler.time_limit, REORDER_TIME_LIMIT)  # the step budget ends it first
    found = reorder_graph(local, time_limit=limit).candidates
    return ops, [(method, tuple(ops.names[v] for v in order)) for method, order in found]
