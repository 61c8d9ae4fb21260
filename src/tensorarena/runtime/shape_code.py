"""The code one input shape of a :class:`~tensorarena.runtime.PlannedProgram` runs.

Generated (:func:`~tensorarena.runtime.generated_code.generate`) over the workspace's block,
over an arena of each call's own with ``outputs="arena"``
(:mod:`~tensorarena.runtime.held_arenas`) or with the outputs in a tail handed over at each call
(``outputs="handover"``, :mod:`~tensorarena.runtime.output_placement`); run at each call
(:func:`run_code`); made anew over the same plan when the workspace's block moved or nodes whose
out variant failed were demoted; and once with every node annotated, for the allocator trace and
the memory recording. The functions take the program; its ``_generate``, ``_regenerate``,
``_pool_tensor`` and ``_annotated_call`` are one-line wrappers over them for other modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensorarena.interop.empty_cache import trim_c_heap
from tensorarena.planning.torch_graph import tensor_spec
from tensorarena.runtime.device import CPU
from tensorarena.runtime.generated_code import Generated, generate
from tensorarena.runtime.held_arenas import HeldArenas
from tensorarena.runtime.kernel_recording import record_kernels, serving
from tensorarena.runtime.materialize import block, slot
from tensorarena.runtime.output_placement import call_memory, placed_code
from tensorarena.runtime.specialization import release_code

if TYPE_CHECKING:
    import torch

    from tensorarena.planning.graph_problem import GraphProblem
    from tensorarena.planning.problem import Plan
    from tensorarena.runtime.kernel_arena import KernelHooks
    from tensorarena.runtime.lowering import Lowering
    from tensorarena.runtime.program import PlannedProgram
    from tensorarena.runtime.specialization import Specialization

__all__ = [
    "annotated_call",
    "arenas_for",
    "generate_code",
    "pool_allocator",
    "regenerate",
    "relower",
    "run_code",
]


def run_code(program: PlannedProgram, current: Specialization, inputs: list[Any]) -> Any:
    """One call of ``current``'s code (its kernels' allocations recorded at the first call; in
    an arena taken for the call with ``outputs="arena"``), then the code made anew where an out
    variant failed or a kernel kept a served block."""
    if current.kernel_note == "to record":
        outputs = record_kernels(program, current, inputs)
        if current.retired:  # the program changed order: every shape is made anew
            return outputs
    elif current.arenas is None:
        outputs = current.generated.run(inputs)
    else:
        memory, current.generated = current.arenas.take()
        outputs = current.arenas.hand_over(current.generated.run(inputs), memory)
    if current.generated.failed:
        relower(program, current)
    elif current.scripts is not None and current.scripts.stale:
        regenerate(program, current)  # a node's kernel kept a served block: not armed now
    return outputs


def generate_code(program: PlannedProgram, graph: GraphProblem, lowering: Lowering, plan: Plan,
                  *, poison: bool, memory: torch.Tensor | None = None,
                  kernel: KernelHooks | None = None, **extra: Any) -> Generated:
    """The code of ``plan`` over ``memory`` (default: the workspace's block)."""
    arena = program.workspace.memory if memory is None else memory
    extra.setdefault("pool_tensor", program._pool_tensor)

    def make(tail: tuple[int, torch.Tensor] | None) -> Generated:
        return generate(program._graph, program._gm, graph, lowering, plan.as_dict(), arena,
                        poison=poison, kernel=kernel, tail=tail, **extra)

    return placed_code(program, make, plan, graph.outputs, arena, kernel)


def arenas_for(program: PlannedProgram, current: Specialization) -> HeldArenas:
    """The arenas ``outputs="arena"`` takes one of at each call, each with its own code."""
    def make_code(memory: torch.Tensor) -> Generated:
        return generate_code(program, current.graph, current.lowering, current.plan,
                             poison=program._poison, memory=memory,
                             kernel=serving(program, current))

    return HeldArenas(make_code, current.plan.height, program.workspace.resource, program.device)


def regenerate(program: PlannedProgram, current: Specialization) -> None:
    """New slots over a new block (the workspace grew, or nodes were demoted): same plan,
    new code. Held arenas start over: blocks the caller holds die with its tensors."""
    if current.arenas is not None:
        current.arenas.release()  # blocks no caller holds go back before new ones are taken
        current.arenas = arenas_for(program, current)
    else:
        release_code(current)  # its bytes (a handed-over tail's) serve the new code
        current.generated = generate_code(program, current.graph, current.lowering,
                                          current.plan, poison=program._poison,
                                          kernel=serving(program, current))
    current.generation = program.workspace.generation
    if program.device == CPU:
        # Compiling a large generated function peaks at tens of MiB of the C heap (its
        # syntax tree), which glibc keeps resident once freed (Llama 125M: 20 MiB).
        trim_c_heap()


def relower(program: PlannedProgram, current: Specialization) -> None:
    """Nodes whose out variant failed take the copy path from now on."""
    for node, reason in current.generated.failed.items():
        program._demoted[node] = reason
        current.lowering.demote(node, reason)
    regenerate(program, current)


def pool_allocator(program: PlannedProgram, name: str) -> Callable[[], torch.Tensor]:
    """What allocates buffer ``name`` (a growing one) from the dynamic pool at each call."""
    value = program._values[name]

    def allocate() -> torch.Tensor:
        spec = tensor_spec(value, name, program._bindings)
        return slot(block(spec.nbytes, program._pool, device=program.device), 0, spec)

    return allocate


def annotated_call(program: PlannedProgram, inputs: list[Any],
                   pool_tensor: Callable[[str], Callable[[], torch.Tensor]] | None = None,
                   ) -> Callable[[], Any]:
    """One call of code whose nodes are profiler ranges ``tensorarena:<path>:<node>``,
    generated now and run when the returned function is called."""
    with program.workspace.use(), program._no_grad():
        bindings = program._binder.bind(inputs)
        current = program._specialization(bindings)
        program._annotated_memory = call_memory(program, current)
        annotated = generate_code(program, current.graph, current.lowering, current.plan,
                                  poison=False, memory=program._annotated_memory,
                                  kernel=serving(program, current), annotate=True,
                                  pool_tensor=pool_tensor or program._pool_tensor)

    def run() -> Any:
        with program.workspace.use(), program._no_grad():
            program._bindings = bindings
            return annotated.run(inputs)

    return run
