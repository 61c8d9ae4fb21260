"""One planned call's memory as a PyTorch memory snapshot: the arena's slots, the pool, torch's own.

:func:`record_call` runs a :class:`~tensorarena.runtime.PlannedProgram` once under the profiler
(:func:`~tensorarena.runtime.measure.profile`, every node a named range) and writes what held
memory during the call in the format of ``torch.cuda.memory._snapshot()`` (``segments`` and one
device trace of ``alloc``/``free_completed``/``segment_alloc`` actions with ``time_us`` and
``frames``, built by :func:`tensorarena.trace.snapshot.build_snapshot`), so that
:func:`tensorarena.report.timeline_from_snapshot` (``tensorarena viz``, ``tensorarena demo``)
and PyTorch's own ``memory_viz`` can draw it:

* the **arena** is one segment held for the whole call; every planned buffer is a block in it at
  ``arena + offset``, from the start of the node that writes it to the end of its last reader
  (the plan's half-open lifetime turned into the profiler's times). The picture is the plan;
* the **dynamic pool** (buffers of growing dimensions) gives one block per buffer at the
  address the pool handed out, over the same lifetime;
* **torch's allocator** gives one segment and block per allocation the profiler saw (results
  left out of the plan, the call's outputs, the temporaries of ops without an out variant,
  wrapped scalars), freed where the profiler saw it freed; blocks still live at the end are the
  outputs handed to the caller. The CPU allocator caches nothing, so what it holds is what it
  reserved: the reserved curve is the planned peak (arena + pool + torch).

Sites name the path and the op (``arena: aten.addmm.default``, ``copy: aten.native_layer_norm
.default``), which the timeline's "top sites" chart ranks. Times are microseconds from the start
of the call. Frees of memory allocated before the call (the previous call's outputs, dropped by
the caller meanwhile) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tensorarena.runtime.execute import annotated_call
from tensorarena.runtime.kernel_arena import KERNEL_TAG
from tensorarena.runtime.measure import profile
from tensorarena.runtime.shape_code import pool_allocator
from tensorarena.trace.pytorch_like import BlockState, SegmentState
from tensorarena.trace.snapshot import SnapshotAction, build_snapshot

if TYPE_CHECKING:
    import torch

    from tensorarena.runtime.compiler import Compiler

__all__ = ["record_call"]

_FREE_FIRST = {"free_completed": 0, "segment_alloc": 1, "alloc": 2}


def record_call(compiler: Compiler, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Run the program of ``compiler`` on ``(*args, **kwargs)`` once, recorded; return its
    result and the snapshot (module docstring). The shape must be planned already or is
    planned by this call."""
    signature = compiler.signature
    inputs = signature.flatten(tuple(args), dict(kwargs))
    pooled: dict[str, tuple[int, int]] = {}  # buffer -> (address, nbytes) from the pool

    def pool_tensor(name: str) -> Callable[[], torch.Tensor]:
        allocate = pool_allocator(compiler, name)

        def recorded() -> torch.Tensor:
            tensor = allocate()
            pooled[name] = (tensor.data_ptr(), tensor.untyped_storage().nbytes())
            return tensor

        return recorded

    try:
        flat, profiled = profile(annotated_call(compiler, inputs, pool_tensor))
        memory = compiler.annotated_memory
    finally:
        compiler.annotated_memory = None  # the call's own arena: not held after it
    current = compiler.last
    assert current is not None  # the call above specialised the program
    nodes = [node.name for node in compiler.graph.nodes]
    ops = {name: path.op for name, path in current.lowering.paths.items()}
    times = profiled.nodes
    origin = min([start for start, _ in times.values()] +
                 [e[0] for e in profiled.events], default=0)
    # Every node index gets a (start, end): unannotated nodes (placeholders, attributes, the
    # output) take the end of the node before them.
    spans: list[tuple[int, int]] = []
    last = origin
    for name in nodes:
        start, end = times.get(name, (last, last))
        spans.append((start, end))
        last = end
    assert memory is not None  # set by the annotated call above
    arena, arena_bytes = memory.data_ptr(), memory.numel()
    stamped: list[tuple[int, SnapshotAction]] = []  # (profiler ns, action without its time)

    def add(kind: str, address: int, nbytes: int, time_ns: int, site: str = "") -> None:
        stamped.append((time_ns, SnapshotAction(kind, address, nbytes, tag=site)))

    add("segment_alloc", arena, arena_bytes, origin, "arena")
    offsets = current.plan.as_dict()
    ticks = current.scripts.ticks if current.scripts is not None else 1
    # A slot a kernel's result is served in starts within its node (kernel_arena.temporaries).
    later = {b.id: b.start % ticks for b in current.plan.problem.buffers}
    for buffer in current.graph.problem.buffers:
        if buffer.id in offsets:
            address, kind = arena + offsets[buffer.id], "arena"
        elif buffer.id in pooled:
            address, kind = pooled[buffer.id][0], "pool"
        else:
            continue
        op = ops.get(nodes[buffer.start], nodes[buffer.start])
        site = f"{kind}: {op}"
        start, end = spans[buffer.start]
        made = start + (end - start) * later.get(buffer.id, 0) // ticks
        add("alloc", address, buffer.nbytes, made, site)
        add("free_completed", address, buffer.nbytes, spans[buffer.end - 1][1], site)
    step_of = {name: i for i, name in enumerate(nodes)}
    for buffer in current.plan.problem.buffers:  # kernels' own allocations planned in the arena
        if KERNEL_TAG in buffer.id:
            # Placed in its node's span as it was in the node's events (kernel_arena.temporaries)
            node = buffer.id.split(KERNEL_TAG)[0]
            start, end = spans[step_of[node]]
            first = step_of[node] * ticks
            made = start + (end - start) * (buffer.start - first) // ticks
            freed = start + (end - start) * (buffer.end - first) // ticks
            address, site = arena + offsets[buffer.id], f"arena: inside {ops.get(node, node)}"
            add("alloc", address, buffer.nbytes, made, site)
            add("free_completed", address, buffer.nbytes, freed, site)
    live: dict[int, int] = {}  # torch's blocks allocated during the call: address -> nbytes
    for time_ns, nbytes, _, path, node, address in profiled.events:
        if nbytes > 0:
            site = f"{path}: {ops.get(node, node)}" if node else "torch, outside any node"
            add("segment_alloc", address, nbytes, time_ns, site)
            add("alloc", address, nbytes, time_ns, site)
            live[address] = nbytes
        elif address in live:
            size = live.pop(address)
            add("free_completed", address, size, time_ns)
            add("segment_free", address, size, time_ns)
    stamped.sort(key=lambda s: (s[0], _FREE_FIRST.get(s[1].action, 0)))
    history = [replace(action, time_us=(time_ns - origin) // 1000)
               for time_ns, action in stamped]
    # The arena's segment lists no blocks: every slot is free again when the call returns.
    segments = [SegmentState(arena, arena_bytes, 0, False, ())]
    segments += [SegmentState(address, nbytes, 0, True,
                              (BlockState(address, nbytes, nbytes, True),))
                 for address, nbytes in live.items()]
    return signature.unflatten(flat, inputs), build_snapshot(history, segments)
