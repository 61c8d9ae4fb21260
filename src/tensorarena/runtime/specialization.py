"""What a :class:`~tensorarena.runtime.PlannedProgram` builds for one input shape.

A :class:`Specialization` holds one shape's planning problem, the path of every node, the plan of
the buffers that live in the arena (:func:`planned_problem`) and the code generated over the
arena's block. The program caches one per shape (least recently used first out); with
``max_shapes`` a smaller shape reuses the plan made for the maximum sizes (:func:`inside_plan`)
instead of planning anew.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.problem import Plan, Problem
from tensorarena.runtime.generated_code import Generated
from tensorarena.runtime.held_arenas import HeldArenas
from tensorarena.runtime.kernel_arena import KernelScripts
from tensorarena.runtime.kernel_state import KERNEL_OFF, KernelNote
from tensorarena.runtime.lowering import Lowering
from tensorarena.runtime.workspace import Workspace

__all__ = ["NOT_GENERATED", "Specialization", "code_to_come", "inside_plan", "planned_problem",
           "release_code", "reserve"]


@dataclass
class Specialization:
    """Everything built for one input shape."""

    bindings: dict[Any, int]
    graph: GraphProblem
    lowering: Lowering
    plan: Plan
    planner_note: str
    generated: Generated
    generation: int  # the workspace's generation the code was generated for
    seconds: float
    arenas: HeldArenas | None = None  # outputs="arena": the blocks the calls' outputs keep
    #: kernels' own allocations (:mod:`~tensorarena.runtime.kernel_arena`): off (and why), to
    #: record at the next call, or on (with the policy that planned them)
    kernel_note: KernelNote = KERNEL_OFF
    scripts: KernelScripts | None = None  # on: the scripts of the nodes served
    #: made for an order the program no longer runs (:mod:`~tensorarena.runtime.kernel_order`):
    #: out of the cache, never run again
    retired: bool = False
    #: its first call ran (then MKL's GEMM buffers were made one: the ``mkl_buffers`` option)
    called: bool = False


#: The code of a specialization that has none of its own (outputs="arena": each held arena has
#: its code; the maximum shapes' plan, which never runs).
NOT_GENERATED = Generated(run=lambda inputs: None, packed_source=b"", slots={}, failed={})


def _not_made(inputs: list[Any]) -> Any:
    raise RuntimeError("internal error: tensorarena ran a shape's code before it was made")


def code_to_come() -> Generated:
    """A placeholder for the code of a shape with ``outputs="arena"`` while its first call runs
    the recording's code (:mod:`~tensorarena.runtime.kernel_recording`). Its own object, not
    :data:`NOT_GENERATED`, since the recording notes the out variants that failed in it."""
    return Generated(run=_not_made, packed_source=b"", slots={}, failed={})


def release_code(current: Specialization) -> None:
    """Drop ``current``'s code and the slots it holds now, so that the bytes under them can
    serve the code made next (a larger block, a re-plan) instead of being held beside it;
    the code is made anew before the shape runs again (its generation is stale)."""
    if current.arenas is None and current.generated is not NOT_GENERATED:
        current.generated.release()
    current.generation = -1


def reserve(workspace: Workspace, nbytes: int, cached: Iterable[Specialization]) -> None:
    """At least ``nbytes`` in ``workspace``. Where its block must grow, the code of every
    ``cached`` shape is released first (each is made anew at its next call, over the new
    block): the old block is then held by nothing and its bytes serve the new one, so growing
    replaces the arena instead of adding one."""
    if nbytes > workspace.nbytes:
        for shape in cached:
            release_code(shape)
    workspace.reserve(nbytes)


def planned_problem(graph: GraphProblem, lowering: Lowering) -> Problem:
    """The buffers of ``graph`` that live in the arena: all but those ``lowering`` left out."""
    return Problem(
        (b for b in graph.problem.buffers if b.id not in lowering.dynamic), name=graph.name
    )


def inside_plan(maximum: Plan, planned: Problem) -> Plan | None:
    """``maximum``'s offsets for ``planned`` if every buffer of it fits in its slot there."""
    offsets = maximum.as_dict()
    sizes = {b.id: b.nbytes for b in maximum.problem.buffers}
    if any(b.id not in sizes or b.nbytes > sizes[b.id] for b in planned.buffers):
        return None  # a buffer grew where the dimensions shrank: plan this shape anew
    # Same lifetimes, no larger sizes, same offsets: no two buffers can overlap. The
    # arena keeps the maximum plan's height, so any shape up to the maximum fits.
    return Plan(planned, tuple(offsets[b.id] for b in planned.buffers),
                planner=maximum.planner, optimal=False)
