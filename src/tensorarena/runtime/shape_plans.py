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

and caches the result (:func:`specialization_for`). The functions take the program;
its ``_specialization`` and ``_classify`` are one-line wrappers over them for other modules.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.planning.problem import Plan, Problem
from tensorarena.planning.torch_graph import free_symbols
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
    from tensorarena.runtime.program import PlannedProgram
    from tensorarena.runtime.run_graph import RunGraph

__all__ = ["build", "classify_nodes", "specialization_for"]


def specialization_for(program: PlannedProgram, bindings: dict[Any, int]) -> Specialization:
    """The shape of ``bindings``: cached (up to ``max_plans``, least recently used first out;
    its code made anew where the workspace's block moved) or built now."""
    key = tuple(bindings[s] for s in program._key_symbols)
    current = program._cache.get(key)
    if current is None:
        current = build(program, bindings)
        program._cache[key] = current
        while len(program._cache) > program._max_plans:
            program._cache.popitem(last=False)
    else:
        program._cache.move_to_end(key)
        if current.arenas is None and current.generation != program.workspace.generation:
            regenerate(program, current)
    program._last = current
    return current


def build(program: PlannedProgram, bindings: dict[Any, int]) -> Specialization:
    """Everything the shape of ``bindings`` runs with: planned, reserved and generated."""
    start = time.perf_counter()
    graph = program._problem_of(bindings)
    lowering = classify_nodes(program, graph)
    planned = planned_problem(graph, lowering)
    plan, note = _plan_for(program, planned, bindings, graph.outputs)
    if program.outputs == "arena":
        current = Specialization(bindings, graph, lowering, plan, note, NOT_GENERATED,
                                  program.workspace.generation, 0.0)
        current.arenas = arenas_for(program, current)
    else:
        reserve(program.workspace, persistent_bytes(program, plan, graph.outputs),
                program._cache.values())
        current = Specialization(
            bindings, graph, lowering, plan, note,
            generate_code(program, graph, lowering, plan, poison=program._poison),
            program.workspace.generation, 0.0)
    current.kernel_note = program._kernel_note
    current.seconds = time.perf_counter() - start
    return current


def classify_nodes(program: PlannedProgram, graph: GraphProblem,
                   run: RunGraph | None = None) -> Lowering:
    """Each node's path for ``graph``, in ``run`` (default: the order the program runs)."""
    run = run or program._run
    return classify(run.graph, graph, unplaceable=program._unplaceable,
                    pooled=_pooled(program), demoted=program._demoted,
                    inplace=run.inplace_nodes, elsewhere=program._elsewhere,
                    planned_outputs=program.outputs != "fresh",
                    composite_out_as_copy=program._kernel_note == "to record")


def _pooled(program: PlannedProgram) -> set[str]:
    if not program._growing:
        return set()
    return {name for name, value in program._values.items()
            if free_symbols(value) & program._growing}


def _plan_for(program: PlannedProgram, planned: Problem, bindings: Mapping[Any, int],
              outputs: Sequence[str] = ()) -> tuple[Plan, str]:
    if program._max_bindings is not None:
        fitted = _inside_max_plan(program, planned)
        if fitted is not None:
            return fitted, "inside the plan for the maximum shapes"
    program.plans_made += 1
    return plan_buffers(program, planned, outputs), ""


def _inside_max_plan(program: PlannedProgram, planned: Problem) -> Plan | None:
    """The maximum-shape plan's offsets for ``planned`` if every buffer fits in its slot."""
    if program._max is None:
        assert program._max_bindings is not None
        program._max = _build_max(program, program._max_bindings)
    return inside_plan(program._max.plan, planned)


def _build_max(program: PlannedProgram, bindings: dict[Any, int]) -> Specialization:
    graph = program._problem_of(bindings)
    lowering = classify_nodes(program, graph)
    planned = planned_problem(graph, lowering)
    program.plans_made += 1
    plan = plan_buffers(program, planned, graph.outputs)
    reserve(program.workspace, persistent_bytes(program, plan, graph.outputs),
                program._cache.values())
    return Specialization(bindings, graph, lowering, plan, "maximum shapes",
                           NOT_GENERATED, program.workspace.generation, 0.0)
