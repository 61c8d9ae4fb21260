"""The code one input shape of a :class:`~tensorarena.runtime.PlannedProgram` runs.

Generated (:func:`~tensorarena.runtime.generated_code.generate`) over the workspace's block,
over an arena of each call's own with ``outputs="arena"``
(:mod:`~tensorarena.runtime.held_arenas`) or with the outputs in a tail handed over at each call
(``outputs="handover"``, :mod:`~tensorarena.runtime.output_placement`); made anew over the same
plan when the workspace's block moved or nodes whose out variant failed were demoted. Running it
is :mod:`~tensorarena.runtime.execute`'s. The functions take the program's
:class:`~tensorarena.runtime.compiler.Compiler`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensorarena.interop.empty_cache import trim_c_heap, trim_pools
from tensorarena.planning.torch_graph import tensor_spec
from tensorarena.runtime.device import CPU
from tensorarena.runtime.generated_code import Generated, generate
from tensorarena.runtime.held_arenas import HeldArenas
from tensorarena.runtime.kernel_arena import KernelHooks
from tensorarena.runtime.materialize import block, slot
from tensorarena.runtime.output_placement import placed_code
from tensorarena.runtime.specialization import release_code

if TYPE_CHECKING:
    import torch

    from tensorarena.planning.graph_problem import GraphProblem
    from tensorarena.planning.problem import Plan
    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.lowering import Lowering
    from tensorarena.runtime.specialization import Specialization

__all__ = [
    "arenas_for",
    "generate_code",
    "pool_allocator",
    "regenerate",
    "relower",
    "serving",
]


def generate_code(compiler: Compiler, graph: GraphProblem, lowering: Lowering, plan: Plan,
                  *, poison: bool, memory: torch.Tensor | None = None,
                  kernel: KernelHooks | None = None, **extra: Any) -> Generated:
    """The code of ``plan`` over ``memory`` (default: the workspace's block)."""
    arena = compiler.workspace.memory if memory is None else memory
    extra.setdefault("pool_tensor", lambda name: pool_allocator(compiler, name))

    def make(tail: tuple[int, torch.Tensor] | None) -> Generated:
        return generate(compiler.graph, compiler.gm, graph, lowering, plan.as_dict(), arena,
                        poison=poison, kernel=kernel, tail=tail, **extra)

    return placed_code(compiler, make, plan, graph.outputs, arena, kernel)


def serving(current: Specialization) -> KernelHooks | None:
    """The hooks that serve ``current``'s scripts in code generated now, or ``None``."""
    scripts = current.scripts
    if scripts is None or not scripts.armed():
        return None
    scripts.stale = False
    return KernelHooks.serving(scripts, scripts.note_escapes)


def arenas_for(compiler: Compiler, current: Specialization) -> HeldArenas:
    """The arenas ``outputs="arena"`` takes one of at each call, each with its own code."""
    def make_code(memory: torch.Tensor) -> Generated:
        return generate_code(compiler, current.graph, current.lowering, current.plan,
                             poison=compiler.poison, memory=memory, kernel=serving(current))

    arenas = HeldArenas(make_code, current.plan.height, compiler.workspace.resource,
                        compiler.device)
    compiler.workspace.keep_idle(arenas)  # empty_cache() gives the idle ones' pages back
    return arenas


def regenerate(compiler: Compiler, current: Specialization) -> None:
    """New slots over a new block (the workspace grew, or nodes were demoted): same plan,
    new code. Held arenas start over: blocks the caller holds die with its tensors."""
    if current.arenas is not None:
        current.arenas.release()  # blocks no caller holds go back before new ones are taken
        current.arenas = arenas_for(compiler, current)
    else:
        release_code(current)  # its bytes (a handed-over tail's) serve the new code
        if compiler.device == CPU:
            # The released tail's pages go back before the code is compiled (the C heap's
            # peak, tens of MiB), not kept resident under it: the call after a shape's
            # recording peaked 20 MiB above the steady calls (Llama 125M 1x256).
            trim_pools(compiler.workspace.resource)
        current.generated = generate_code(compiler, current.graph, current.lowering,
                                          current.plan, poison=compiler.poison,
                                          kernel=serving(current))
    current.generation = compiler.workspace.generation
    if compiler.device == CPU:
        # A generated function compiled here (short, or no child could: source_compile)
        # peaks in the C heap (its syntax tree), which glibc keeps resident once freed.
        trim_c_heap()


def relower(compiler: Compiler, current: Specialization) -> None:
    """Nodes whose out variant failed take the copy path from now on."""
    for node, reason in current.generated.failed.items():
        compiler.demoted[node] = reason
        current.lowering.demote(node, reason)
    regenerate(compiler, current)


def pool_allocator(compiler: Compiler, name: str) -> Callable[[], torch.Tensor]:
    """What allocates buffer ``name`` (a growing one) from the dynamic pool at each call."""
    value = compiler.values[name]

    def allocate() -> torch.Tensor:
        spec = tensor_spec(value, name, compiler.bindings)
        return slot(block(spec.nbytes, compiler.pool, device=compiler.device), 0, spec)

    return allocate
