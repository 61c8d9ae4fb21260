"""One call of a :class:`~tensorarena.runtime.PlannedProgram`: its shape's code, run.

:func:`execute` binds the inputs' sizes, finds or builds the shape
(:func:`~tensorarena.runtime.shape_plans.specialization_for`) and runs its code
(:func:`run_code`): at a shape's first call with the kernel arena, the recording call
(:mod:`~tensorarena.runtime.kernel_recording`); after a shape's first call, MKL's GEMM
buffers are made one (:mod:`~tensorarena.interop.mkl_buffers`, the ``mkl_buffers`` option).
:func:`annotated_call` makes one call whose
nodes are profiler ranges, for the allocator trace and the memory recording. This is the top of
the stages: it imports them, none of them imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensorarena.interop.mkl_buffers import consolidate
from tensorarena.runtime.kernel_recording import record_kernels
from tensorarena.runtime.kernel_state import KernelState
from tensorarena.runtime.output_placement import call_memory
from tensorarena.runtime.shape_code import (
    generate_code,
    pool_allocator,
    regenerate,
    relower,
    serving,
)
from tensorarena.runtime.shape_plans import specialization_for

if TYPE_CHECKING:
    import torch

    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.specialization import Specialization

__all__ = ["annotated_call", "execute", "run_code"]


def execute(compiler: Compiler, inputs: list[Any]) -> Any:
    """One call with the placeholder values ``inputs``; the graph's flat outputs."""
    with compiler.workspace.use(), compiler.no_grad():
        bindings = compiler.binder.bind(inputs)
        current = specialization_for(compiler, bindings)
        compiler.bindings = bindings
        outputs = run_code(compiler, current, inputs)
        if not current.called:
            current.called = True
            if compiler.mkl_buffers and compiler.device == "cpu":
                consolidate()  # its GEMMs have run once: MKL holds every buffer they need
        return outputs


def run_code(compiler: Compiler, current: Specialization, inputs: list[Any]) -> Any:
    """One call of ``current``'s code (its kernels' allocations recorded at the first call; in
    an arena taken for the call with ``outputs="arena"``), then the code made anew where an out
    variant failed or a kernel kept a served block."""
    if current.kernel_note.state is KernelState.TO_RECORD:
        outputs = record_kernels(compiler, current, inputs)
        if current.retired:  # the program changed order: every shape is made anew
            return outputs
    elif current.arenas is None:
        outputs = current.generated.run(inputs)
    else:
        memory, current.generated = current.arenas.take()
        outputs = current.arenas.hand_over(current.generated.run(inputs), memory)
    if current.generated.failed:
        relower(compiler, current)
    elif current.scripts is not None and current.scripts.stale:
        regenerate(compiler, current)  # a node's kernel kept a served block: not armed now
    return outputs


def annotated_call(compiler: Compiler, inputs: list[Any],
                   pool_tensor: Callable[[str], Callable[[], torch.Tensor]] | None = None,
                   ) -> Callable[[], Any]:
    """One call of code whose nodes are profiler ranges ``tensorarena:<path>:<node>``,
    generated now and run when the returned function is called. Its arena is
    :attr:`Compiler.annotated_memory <tensorarena.runtime.compiler.Compiler.annotated_memory>`
    until the caller clears it."""
    with compiler.workspace.use(), compiler.no_grad():
        bindings = compiler.binder.bind(inputs)
        current = specialization_for(compiler, bindings)
        compiler.annotated_memory = call_memory(compiler, current)
        annotated = generate_code(
            compiler, current.graph, current.lowering, current.plan, poison=False,
            memory=compiler.annotated_memory, kernel=serving(current), annotate=True,
            pool_tensor=pool_tensor or (lambda name: pool_allocator(compiler, name)))

    def run() -> Any:
        with compiler.workspace.use(), compiler.no_grad():
            compiler.bindings = bindings
            return annotated.run(inputs)

    return run
