"""One-off calls of a program, each in an arena of its own: traced, and what follows any of them.

:meth:`~tensorarena.runtime.PlannedProgram.trace_allocations` runs one annotated call under
the profiler (:func:`traced_call`); ``verify`` and ``record_memory`` run theirs in
:mod:`~tensorarena.runtime.verification` and :mod:`~tensorarena.runtime.recording`. After each,
:func:`give_back` returns the one-off arena's pages to the system, and
:func:`give_back_planning` what making a program left resident.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.interop.empty_cache import trim_c_heap, trim_pools
from tensorarena.runtime.device import CPU
from tensorarena.runtime.execute import annotated_call
from tensorarena.runtime.measure import AllocatorTrace, trace_allocations

if TYPE_CHECKING:
    from tensorarena.runtime.compiler import Compiler

__all__ = ["give_back", "give_back_planning", "traced_call"]


def traced_call(compiler: Compiler, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> tuple[Any, AllocatorTrace]:
    """Run the program of ``compiler`` once annotated; its result and what torch's allocator
    did meanwhile, charged to node paths (:mod:`~tensorarena.runtime.measure`)."""
    inputs = compiler.signature.flatten(tuple(args), dict(kwargs))
    try:
        flat, trace = trace_allocations(annotated_call(compiler, inputs))
    finally:
        compiler.annotated_memory = None  # the call's own arena: not held after it
    return compiler.signature.unflatten(flat, inputs), trace


def give_back(compiler: Compiler) -> None:
    """After a one-off call in an arena of its own (verify, traced, recorded): that arena,
    empty now, goes back to the system rather than staying resident in the pool (a verified
    training step kept a second arena as large as its first)."""
    if compiler.device == CPU:
        trim_pools(compiler.workspace.resource)


def give_back_planning(compiler: Compiler) -> None:
    """After a program is made on the CPU: an export and its planning free most of what they
    allocate, in many small pieces glibc keeps resident; the free pages go back to the system."""
    if compiler.device == CPU:
        trim_c_heap()
