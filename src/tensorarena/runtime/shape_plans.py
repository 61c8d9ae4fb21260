"""One input shape of a :class:`~tensorarena.runtime.PlannedProgram` planned.

For each input shape the program

1. builds the graph's planning problem (:mod:`tensorarena.planning.torch_frontend`, with the
   shape's values for the size symbols of a dynamic graph);
2. decides each node's path (:func:`~tensorarena.runtime.lowering.classify`) and leaves out of
   the plan what cannot live in the arena;
3. plans the rest (:func:`tensorarena.planning.plan`; inside the plan for the maximum shapes
   when ``max_shapes`` is given and every buffer fits in its slot; with ``outputs="handover"``
   the outputs in a tail, :mod:`~tensorarena.runtime.output_placement`) and reserves the plan's
   height in its :class:`~tensorarena.runtime.workspace.Workspace`, one block from a
   tensorarena resource;
4. generates straight-line code that writes each result into its slot
   (:mod:`~tensorarena.runtime.shape_code`),

and caches the result (:func:`specialization_for`). The functions take the program's
:class:`~tensorarena.runtime.compiler.Compiler`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.planning.problem import Plan, Problem
from tensorarena.runtime.kernel_state import KernelState
from tensorarena.runtime.lowering import Lowering, classify
from tensorarena.runtime.output_placement import persistent_bytes, plan_buffers
from tensorarena.runtime.shape_code import arenas_for, generate_code, regenerate
from tensorarena.runtime.specialization import (
    NOT_GENERATED,
    Specialization,
    inside_plan,
    planned_problem,
    reserve,
)

if TYPE_CHECKING:
    from tensorarena.planning.graph_problem import GraphProblem
    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.run_graph import RunGraph

__all__ = ["build", "classify_nodes", "specialization_for"]


def specialization_for(compiler: Compiler, bindings: dict[Any, int]) -> Specialization:
    """The shape of ``bindings``: cached (up to ``max_plans``, least recently used first out;
    its code made anew where the workspace's block moved) or built now."""
    key = tuple(bindings[s] for s in compiler.key_symbols)
    current = compiler.cache.get(key)
    if current is None:
        current = build(compiler, bindings)
        compiler.cache[key] = current
        while len(compiler.cache) > compiler.max_plans:
            compiler.cache.popitem(last=False)
    else:
        compiler.cache.move_to_end(key)
        if (current.arenas is None and current.generation != compiler.workspace.generation
                and current.kernel_note.state is not KernelState.TO_RECORD):
            regenerate(compiler, current)  # (a shape to record runs the recording's code)
    compiler.last = current
    return current


def build(compiler: Compiler, bindings: dict[Any, int]) -> Specialization:
    """Everything the shape of ``bindings`` runs with: planned, reserved and generated."""
    start = time.perf_counter()
    graph = compiler.problem_of(bindings)
    lowering = classify_nodes(compiler, graph)
    planned = planned_problem(graph, lowering)
    plan, note = _plan_for(compiler, planned, bindings, graph.outputs)
    if compiler.outputs == "arena":
        current = Specialization(bindings, graph, lowering, plan, note, NOT_GENERATED,
                                  compiler.workspace.generation, 0.0)
        current.arenas = arenas_for(compiler, current)
    else:
        reserve(compiler.workspace, persistent_bytes(compiler, plan, graph.outputs),
                compiler.cache.values())
        # Made even where the first call runs the recording's code instead: without it, the
        # steady calls' code landed in two more interpreter arenas (Llama 125M 1x256: +1.6
        # MiB resident at every later call); the C heap its compile left is given back before
        # the recording call runs (kernel_recording.py).
        current = Specialization(
            bindings, graph, lowering, plan, note,
            generate_code(compiler, graph, lowering, plan, poison=compiler.poison),
            compiler.workspace.generation, 0.0)
    current.kernel_note = compiler.kernel_note
    current.seconds = time.perf_counter() - start
    return current


def classify_nodes(compiler: Compiler, graph: GraphProblem,
                   run: RunGraph | None = None) -> Lowering:
    """Each node's path for ``graph``, in ``run`` (default: the order the program runs)."""
    run = run or compiler.run
    return classify(run.graph, graph, unplaceable=compiler.unplaceable,
                    pooled=compiler.pooled(), demoted=compiler.demoted,
                    inplace=run.inplace_nodes, elsewhere=compiler.elsewhere,
                    planned_outputs=compiler.outputs != "fresh",
                    composite_out_as_copy=compiler.kernel_note.state is KernelState.TO_RECORD)


def _plan_for(compiler: Compiler, planned: Problem, bindings: Mapping[Any, int],
              outputs: Sequence[str] = ()) -> tuple[Plan, str]:
    if compiler.max_bindings is not None:
        fitted = _inside_max_plan(compiler, planned)
        if fitted is not None:
            return fitted, "inside the plan for the maximum shapes"
    compiler.plans_made += 1
    return plan_buffers(compiler, planned, outputs), ""


def _inside_max_plan(compiler: Compiler, planned: Problem) -> Plan | None:
    """The maximum-shape plan's offsets for ``planned`` if every buffer fits in its slot."""
    if compiler.max_shape is None:
        assert compiler.max_bindings is not None
        compiler.max_shape = _build_max(compiler, compiler.max_bindings)
    return inside_plan(compiler.max_shape.plan, planned)


def _build_max(compiler: Compiler, bindings: dict[Any, int]) -> Specialization:
    graph = compiler.problem_of(bindings)
    lowering = classify_nodes(compiler, graph)
    planned = planned_problem(graph, lowering)
    compiler.plans_made += 1
    plan = plan_buffers(compiler, planned, graph.outputs)
    reserve(compiler.workspace, persistent_bytes(compiler, plan, graph.outputs),
                compiler.cache.values())
    return Specialization(bindings, graph, lowering, plan, "maximum shapes",
                           NOT_GENERATED, compiler.workspace.generation, 0.0)
