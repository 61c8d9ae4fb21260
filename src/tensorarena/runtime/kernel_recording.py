"""The first call of a shape with kernels' allocations served from the arena: record, plan again.

:func:`record_kernels` runs one call of a :class:`~tensorarena.runtime.PlannedProgram` shape
with the shim recording every op node (:mod:`~tensorarena.runtime.kernel_arena`), adds the
allocations freed within their node to the shape's plan as buffers live while it runs, plans
again and generates the code that serves them. The recorded call itself runs with every kernel
allocation forwarded to torch's allocator, so its results are those of a call without the shim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tensorarena.planning.planners import plan as make_plan
from tensorarena.runtime.kernel_arena import (
    KernelHooks,
    KernelRecording,
    KernelScripts,
    temporaries,
)

if TYPE_CHECKING:
    from tensorarena.runtime.program import PlannedProgram
    from tensorarena.runtime.specialization import Specialization

__all__ = ["record_kernels", "serving"]

_OP_NODES = ("call_function", "call_method", "call_module")


def record_kernels(program: PlannedProgram, current: Specialization, inputs: list[Any]) -> Any:
    """Run ``current`` once recording its kernels' allocations, then plan them; return the
    call's outputs (handed over as :meth:`PlannedProgram.run_flat` would)."""
    graph = program._graph
    recording = KernelRecording()
    hooks = recording.hooks(n.name for n in graph.nodes if n.op in _OP_NODES)
    if current.arenas is not None:
        memory, current.generated = current.arenas.take()
    else:
        memory = program.workspace.memory
    code = program._generate(current.graph, current.lowering, current.plan,
                             poison=program._poison, memory=memory, kernel=hooks)
    outputs = code.run(inputs)
    if current.arenas is not None:
        outputs = current.arenas.hand_over(outputs, memory)
    steps = {node.name: i for i, node in enumerate(graph.nodes)}
    base = memory.data_ptr()
    starts = {name: base + offset for name, offset in current.plan.as_dict().items()}
    in_slots = recording.in_slots(current.lowering.results, code.slots, starts)
    planned, ticks = temporaries(recording, steps, current.plan.problem, in_slots)
    current.kernel_note = "on"
    if len(planned) == len(current.plan.problem) and not in_slots:
        current.scripts = KernelScripts()
    else:
        current.plan = make_plan(planned, program._planner, time_limit=program._time_limit)
        offsets = current.plan.as_dict()
        offsets.update({kernel: offsets[slot] for kernel, slot in in_slots.items()})
        current.scripts = KernelScripts.build(recording, offsets)
        current.scripts.ticks = ticks
        if current.arenas is None:
            program.workspace.reserve(current.plan.height)
            program._regenerate(current)
        else:  # the blocks made so far serve the new plan where it fits in them
            held = current.arenas
            program._regenerate(current)
            if held.remake(current.arenas._make_code, current.plan.height):
                current.arenas = held
    current.generated.failed.update(code.failed)  # out variants that failed: re-lowered next
    return outputs


def serving(program: PlannedProgram, current: Specialization) -> KernelHooks | None:
    """The hooks that serve ``current``'s scripts in code generated now, or ``None``."""
    scripts = current.scripts
    if scripts is None or not scripts.armed():
        return None
    scripts.stale = False
    return KernelHooks.serving(scripts, scripts.note_escapes)
