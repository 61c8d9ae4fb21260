"""What torch's own allocator does during a call: every allocation, the peak, and where.

Measured, not estimated: :func:`trace_allocations` runs a callable under ``torch.profiler`` with
memory profiling and reads the profiler's event tree, where every allocation and free of torch's
CPU allocator is an event carrying its size and the running total. A planned program run with
annotations (:meth:`~tensorarena.runtime.PlannedProgram.trace_allocations`) marks each node with
a profiler range ``tensorarena:<path>:<node>``, so every allocation is charged to the path of the
node it happened in: allocations charged to ``out`` and ``copy`` are made *for planned
intermediates* (the temporaries of ops that cannot write into their slot, or of out variants
that compute elsewhere and copy); those charged to ``dynamic`` are the outputs and results left
out of the plan. Memory from tensorarena resources (the arena) is not torch's and never appears.

Profiling slows the call down: use it for counts and bytes, never for latency.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tensorarena._optional import load_torch
from tensorarena.trace.profiler_allocations import profiler_allocations

__all__ = ["AllocatorTrace", "Profiled", "profile", "trace_allocations"]

ANNOTATION_PREFIX = "tensorarena:"
#: Allocations of at most this many bytes are counted as wrapped scalars.
SCALAR_BYTES = 8


@dataclass(frozen=True)
class AllocatorTrace:
    """Torch allocator activity during one call: ``allocations`` and ``frees`` (calls),
    ``allocated_bytes`` (sum of the sizes allocated), ``peak_bytes`` (the most bytes live at once
    of those the call allocated: its own peak, whatever it frees of memory from before it), and
    ``by_path`` (allocations per node path; ``"outside"`` for those outside any annotated
    node, e.g. in eager code), ``scalars_by_path`` (of those, the ones of at most
    :data:`SCALAR_BYTES`: Python numbers ATen wraps in a one-element tensor, as in ``x * 0.5``,
    and their dtype conversions)."""

    allocations: int
    frees: int
    allocated_bytes: int
    peak_bytes: int
    by_path: dict[str, int] = field(default_factory=dict)
    scalars_by_path: dict[str, int] = field(default_factory=dict)

    @property
    def planned_allocations(self) -> int:
        """Allocations made while writing planned intermediates (``out`` and ``copy`` paths)."""
        return self.by_path.get("out", 0) + self.by_path.get("copy", 0)

    @property
    def small_planned_allocations(self) -> int:
        """Of :attr:`planned_allocations`, those of wrapped scalars (at most 8 bytes)."""
        return self.scalars_by_path.get("out", 0) + self.scalars_by_path.get("copy", 0)


@dataclass(frozen=True)
class Profiled:
    """What the profiler saw of one call: every allocator event as ``(time_ns, nbytes, total,
    path, node, address)`` in time order (``nbytes`` negative for a free; ``path`` and ``node``
    from the innermost annotated node around it, ``"outside"`` and ``""`` otherwise), and the
    ``(start_ns, end_ns)`` of every annotated node by node name."""

    events: list[tuple[int, int, int, str, str, int]]
    nodes: dict[str, tuple[int, int]]


def profile(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Profiled]:
    """Call ``fn(*args, **kwargs)`` under the profiler with memory profiling; return its result
    and the allocator events and node ranges (:class:`Profiled`)."""
    torch = load_torch()
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        result = fn(*args, **kwargs)
    seen = profiler_allocations(prof, scope_prefix=ANNOTATION_PREFIX)
    nodes = {_node_of(name)[1]: (start, end) for name, start, end in seen.scopes}
    events = sorted((a.time_ns, a.nbytes, a.total_bytes, *_node_of(a.scope), a.address)
                    for a in seen.allocations)
    return result, Profiled(events, nodes)


def _node_of(scope: str) -> tuple[str, str]:
    """``(path, node)`` of an annotation ``tensorarena:<path>:<node>``; ``("outside", "")``
    for no scope."""
    if not scope:
        return "outside", ""
    _, path, node = scope.split(":", 2)
    return path, node


def trace_allocations(
    fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> tuple[Any, AllocatorTrace]:
    """Call ``fn(*args, **kwargs)`` under the profiler; return its result and the trace."""
    result, profiled = profile(fn, *args, **kwargs)
    by_path: dict[str, int] = {}
    scalars: dict[str, int] = {}
    allocations = frees = allocated = peak = level = 0
    # The level counts the call's own allocations only. The profiler's running total also
    # drops when the call frees memory from before it whose size it knows (allocated in an
    # earlier profiled call: the previous step's gradients, freed by zero_grad), which would
    # hide as much of the call's own peak (tiny Llama's eager step measured 35 080 bytes for
    # 396 808).
    live: dict[int, int] = {}
    for _, size, _, path, _, address in profiled.events:
        if size > 0:
            allocations += 1
            allocated += size
            by_path[path] = by_path.get(path, 0) + 1
            if size <= SCALAR_BYTES:
                scalars[path] = scalars.get(path, 0) + 1
            live[address] = size
            level += size
            peak = max(peak, level)
        else:
            frees += 1
            level -= live.pop(address, 0)
    return result, AllocatorTrace(allocations, frees, allocated, peak, by_path, scalars)
