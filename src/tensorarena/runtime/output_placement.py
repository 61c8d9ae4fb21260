"""Where a :class:`~tensorarena.runtime.PlannedProgram`'s outputs live: the ``outputs`` option.

By default (``outputs="fresh"``) the buffers a graph returns (and everything they
view) are left out of the plan and made fresh at each call, so the caller owns them outright and
the next call cannot overwrite them: the plan is made *around* the outputs rather than copying
them out, which costs nothing but those outputs' own allocation, exactly what eager execution
pays, on top of the arena. With ``outputs="arena"`` they are planned too and handed over as
views of the arena, which then stays the caller's until the last of them is gone; each call
takes an arena no caller holds (:mod:`~tensorarena.runtime.held_arenas`). That lets the outputs
reuse the bytes of intermediates that died before them (a training step's gradients, those of
its activations) instead of coming on top of the arena. ``outputs="handover"`` plans them in a
tail of the arena that each call takes anew and hands over with them
(:mod:`~tensorarena.runtime.output_tail`): the peak is that of the arena with its outputs, and a
caller that keeps them keeps the tail, not the whole arena. Outputs in the arena or the tail
have storage that cannot be resized: growing one with ``resize_`` raises in torch 2.13 but
leaves the new shape behind, and reading it then crashes the process (torch's bug, the same for
``torch.from_numpy`` tensors); copy an output (``.clone()``) before resizing it.

What the placement changes for one shape: how its buffers are planned (:func:`plan_buffers`),
the bytes held across calls (:func:`persistent_bytes`), the code generated (:func:`placed_code`)
and the arena of a one-off call (:func:`call_memory`). The functions take the program's
:class:`~tensorarena.runtime.compiler.Compiler`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tensorarena.planning.planners import plan as make_plan
from tensorarena.planning.problem import Plan, Problem
from tensorarena.runtime.materialize import block
from tensorarena.runtime.options import OutputPlacement
from tensorarena.runtime.output_tail import kernel_patches, split_plan, tail_start, with_tail

if TYPE_CHECKING:
    import torch

    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.generated_code import Generated
    from tensorarena.runtime.kernel_arena import KernelHooks
    from tensorarena.runtime.specialization import Specialization

__all__ = ["OutputPlacement", "call_memory", "persistent_bytes", "placed_code", "plan_buffers"]

def plan_buffers(compiler: Compiler, planned: Problem, outputs: Sequence[str]) -> Plan:
    """Plan ``planned``; with ``outputs="handover"``, its ``outputs`` in the tail."""
    def plan_part(part: Problem) -> Plan:
        return make_plan(part, compiler.planner, time_limit=compiler.time_limit)

    if compiler.outputs != "handover":
        return plan_part(planned)
    return split_plan(planned, outputs, plan_part)


def persistent_bytes(compiler: Compiler, plan: Plan, outputs: Sequence[str]) -> int:
    """The bytes of ``plan`` held across calls: all but a handed-over tail."""
    return tail_start(plan, outputs) if compiler.outputs == "handover" else plan.height


def placed_code(compiler: Compiler, make: Callable[[tuple[int, torch.Tensor] | None],
                                                        Generated],
                plan: Plan, outputs: Sequence[str], arena: torch.Tensor,
                kernel: KernelHooks | None) -> Generated:
    """The code ``make(tail)`` makes over ``arena``; with ``outputs="handover"``, with the
    buffers from the tail start on in a tail handed over at each call."""
    if compiler.outputs != "handover":
        return make(None)
    start = tail_start(plan, outputs)
    return with_tail(make, start, plan.height - start, compiler.workspace.resource,
                     compiler.device, arena, kernel_patches(kernel, start),
                     keep_idle=compiler.workspace.keep_idle)


def call_memory(compiler: Compiler, current: Specialization) -> torch.Tensor:
    """The arena for a one-off call (verify, traced, recorded): the workspace's block, or
    with ``outputs="arena"`` a block of its own that its outputs keep."""
    if current.arenas is None:
        return compiler.workspace.memory
    return block(current.plan.height, compiler.workspace.resource, device=compiler.device)
