"""The first call of a shape with kernels' allocations served from the arena: record, plan again.

:func:`record_kernels` runs one call of a :class:`~tensorarena.runtime.PlannedProgram` shape
with the shim recording every op node (:mod:`~tensorarena.runtime.kernel_arena`), adds the
allocations freed within their node to the shape's plan as buffers live while it runs, plans
again and generates the code that serves them. The recorded call itself runs with every kernel
allocation forwarded to torch's allocator, so its results are those of a call without the shim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.interop.empty_cache import trim_c_heap, trim_pools
from tensorarena.interop.mkl_buffers import consolidate, held
from tensorarena.planning.problem import Buffer, Plan, Problem, lower_bound
from tensorarena.runtime.device import CPU
from tensorarena.runtime.kernel_arena import (
    KERNEL_TAG,
    KernelHooks,
    KernelRecording,
    KernelScripts,
    temporaries,
)
from tensorarena.runtime.kernel_order import choose_order
from tensorarena.runtime.kernel_state import KernelNote, KernelState
from tensorarena.runtime.output_placement import call_memory, persistent_bytes, plan_buffers
from tensorarena.runtime.shape_code import arenas_for, generate_code
from tensorarena.runtime.shape_plans import specialization_for
from tensorarena.runtime.specialization import code_to_come, release_code, reserve

if TYPE_CHECKING:
    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.specialization import Specialization

__all__ = ["record_kernels"]

_OP_NODES = ("call_function", "call_method", "call_module")


def record_kernels(compiler: Compiler, current: Specialization, inputs: list[Any]) -> Any:
    """Run ``current`` once recording its kernels' allocations, then plan them; return the
    call's outputs (handed over as :meth:`PlannedProgram.run_flat` would). With
    ``reorder=True`` the program's first recording may change its order
    (:func:`~tensorarena.runtime.kernel_order.choose_order`): ``current`` is then retired and
    the shape planned anew in the new order with this recording (:func:`_carried_over`)."""
    graph = compiler.graph
    recording = KernelRecording()
    hooks = recording.hooks(n.name for n in graph.nodes if n.op in _OP_NODES)
    if compiler.mkl_buffers and compiler.device == CPU:
        hooks = one_gemm_buffer(hooks)
    if current.arenas is not None:
        memory = current.arenas.take_block()  # no code of its own: the recording's runs
        current.generated = code_to_come()  # where the out variants that fail are noted
    else:
        release_code(current)  # its slots' bytes (a handed-over tail's) serve this code
        memory = compiler.workspace.memory
    code = generate_code(compiler, current.graph, current.lowering, current.plan,
                         poison=compiler.poison, memory=memory, kernel=hooks)
    if compiler.device == CPU:
        # Code compiled here (short, or no child could: source_compile) left the C heap of
        # its syntax tree, free now: given back before the call touches the arena's pages and
        # its kernels' temporaries come on top.
        trim_c_heap()
    outputs = code.run(inputs)
    if current.arenas is not None:
        outputs = current.arenas.hand_over(outputs, memory)
    in_slots = recording.in_slots(current.lowering.results, code.slots,
                                  _starts(current, memory))
    failed = dict(code.failed)
    # The recording code is never run again: it and the reference to the block go before
    # anything is planned or reserved anew, so that a grown workspace replaces its block, and
    # not when the collector breaks the code's cycle (a block the caller holds stays the
    # caller's).
    code.release()
    del code, memory
    if compiler.order_open:  # reorder=True: choose the order again, these allocations counted
        compiler.order_open = False
        calls = _calls(graph)
        if choose_order(compiler, current, recording, in_slots):
            compiler.demoted.update(failed)  # out variants that failed: copied from now on
            current.kernel_note = KernelNote(KernelState.RETIRED)
            if current.arenas is not None:  # retired: its blocks go once the caller's do
                current.arenas.release()
            new = specialization_for(compiler, current.bindings)
            carried = _carried_over(compiler, recording, calls, current, new)
            memory = call_memory(compiler, new)
            probe = generate_code(compiler, new.graph, new.lowering, new.plan, poison=False,
                                  memory=memory)
            in_slots = carried.in_slots(new.lowering.results, probe.slots, _starts(new, memory))
            # Only the slots' addresses were wanted: the code and its block go now, not when
            # the collector breaks the code's cycle (a block of its own with outputs="arena":
            # a reordered training step kept a second 745 MiB arena resident).
            probe.release()
            del probe, memory
            _plan_recorded(compiler, new, carried, in_slots)
            if compiler.device == CPU:
                trim_pools(compiler.workspace.resource)
            return outputs
    _plan_recorded(compiler, current, recording, in_slots)
    current.generated.failed.update(failed)  # out variants that failed: re-lowered next
    if compiler.device == CPU:
        # The recorded call ran like an eager one (its kernels' temporaries from torch's
        # allocator, glibc's heap on the CPU), and the arena now serves them: give back the
        # heap pages they left (ResNet-50 2x224x224: 37 MiB kept resident beside the arena).
        trim_c_heap()
    return outputs


def one_gemm_buffer(hooks: KernelHooks) -> KernelHooks:
    """``hooks`` that also leave MKL with its largest GEMM buffer after each node at which it
    took a new one (:func:`~tensorarena.interop.mkl_buffers.consolidate`; none is in use
    between nodes), so that the recorded call never holds a buffer per GEMM size, as eager's
    first call does (GPT-2 124M: 9.2 MiB in 3 buffers until the call ends), but at most the
    largest so far and the one taken last. Nothing is done where MKL is not reachable."""
    if held() is None:
        return hooks
    end = hooks.end
    seen = [held()]

    def end_and_consolidate(log: Any) -> Any:
        result = end(log)
        now = held()
        if now is not None and now != seen[0]:
            if now.buffers > 1:
                now = consolidate()
                trim_c_heap()  # a buffer glibc had carved from its heap is given back too
            seen[0] = now
        return result

    return dataclasses.replace(hooks, end=end_and_consolidate)


def _starts(current: Specialization, memory: Any) -> dict[str, int]:
    """The address of each planned buffer of ``current`` in ``memory``."""
    base = memory.data_ptr()
    return {name: base + offset for name, offset in current.plan.as_dict().items()}


def _calls(graph: Any) -> dict[str, tuple[Any, str, str]]:
    """Each node's call: its target and arguments (by node name)."""
    return {node.name: (node.target, repr(node.args), repr(node.kwargs)) for node in graph.nodes}


def _carried_over(compiler: Compiler, recording: KernelRecording,
                  calls: dict[str, tuple[Any, str, str]], old: Specialization,
                  new: Specialization) -> KernelRecording:
    """``recording`` (made running ``old``, whose nodes made ``calls``) for ``new``, a shape
    of the order the program runs now: only the nodes that make the same call in both, on the
    same path. A node rewritten in one order only (run in place, or given another operand
    copy) may allocate otherwise: its allocations are left to torch."""
    same = {name for name, call in _calls(compiler.graph).items() if calls.get(name) == call
            and name in old.lowering.paths and name in new.lowering.paths
            and old.lowering.paths[name].path == new.lowering.paths[name].path}
    return KernelRecording({n: log for n, log in recording.logs.items() if n in same},
                           {n: r for n, r in recording.results.items() if n in same})


def _plan_recorded(compiler: Compiler, current: Specialization,
                   recording: KernelRecording, in_slots: dict[str, str]) -> None:
    """Plan ``current`` again with ``recording``'s allocations and make the code that serves
    them (``in_slots``: allocations served in a result's slot)."""
    steps = {node.name: i for i, node in enumerate(compiler.graph.nodes)}
    planned, ticks = temporaries(recording, steps, current.plan.problem, in_slots)
    current.kernel_note = KernelNote(KernelState.ON)
    if len(planned) == len(current.plan.problem) and not in_slots:
        current.scripts = KernelScripts()
    else:
        fresh = [Buffer(b.id, b.start * ticks, b.end * ticks, b.nbytes)
                 for b in current.graph.problem.buffers if b.id in current.lowering.dynamic]
        before = current.plan
        current.plan, chosen = _plan(compiler, planned, before, fresh, current.graph.outputs)
        current.kernel_note = KernelNote(KernelState.ON, chosen)
        if current.plan is before:  # the plan in graph steps: none planned but in their slots
            ticks = 1
        offsets = current.plan.as_dict()
        offsets.update({kernel: offsets[slot] for kernel, slot in in_slots.items()})
        current.scripts = KernelScripts.build(recording, offsets)
        current.scripts.ticks = ticks
        if current.arenas is None:
            # The code is made at the next call (the shape's generation is stale), when the
            # caller may have let go of this call's outputs: their tail then serves it again.
            release_code(current)
            reserve(compiler.workspace,
                    persistent_bytes(compiler, current.plan, current.graph.outputs),
                    compiler.cache.values())
        else:  # the blocks made so far serve the new plan where it fits in them, else go
            held = current.arenas
            remade = arenas_for(compiler, current)
            if not held.remake(remade.make_code, current.plan.height):
                # Given back now, not when the collector breaks their code's cycles: a
                # training step held its old arena beside the new one (GPT-2 2x128: 1.5 GiB
                # resident for a 738 MiB arena).
                held.release()
                current.arenas = remade
            current.generation = compiler.workspace.generation


def _plan(compiler: Compiler, planned: Problem, before: Plan,
          fresh: list[Buffer], outputs: Sequence[str]) -> tuple[Plan, str]:
    """The plan with kernels' allocations and the policy that chose it (``kernel_policy``):
    ``"all"`` plans every one; ``"idle"`` only those that keep ``before``'s height (the nodes
    where they would raise it are left to torch; ``before`` itself if even that does not fit:
    allocations served in their slot need no bytes); ``"lower"`` takes whichever of the two
    gives the lower peak, the arena plus what torch holds at once of ``fresh`` (the buffers
    made fresh at each call, in the plan's time) and of the allocations left to it."""
    policy = compiler.kernel_policy
    every = plan_buffers(compiler, planned, outputs)
    if policy == "all" or every.height <= before.height:
        return every, "all"
    within = _within(planned, before.height)
    idle = plan_buffers(compiler, within, outputs)
    if idle.height > before.height:
        idle = before
    if policy == "idle":
        return idle, "idle"
    kept = {b.id for b in idle.problem.buffers}
    left = [b for b in planned.buffers if KERNEL_TAG in b.id and b.id not in kept]
    if every.height + lower_bound(fresh) <= idle.height + lower_bound(fresh + left):
        return every, "lower peak: all"
    return idle, "lower peak: idle"


def _within(problem: Problem, height: int) -> Problem:
    """``problem`` without the kernel allocations of every node where its live bytes exceed
    ``height`` (no plan of it could stay within ``height`` there)."""
    ends = max((b.end for b in problem.buffers), default=0)
    change = [0] * (ends + 1)
    for b in problem.buffers:
        change[b.start] += b.nbytes
        change[b.end] -= b.nbytes
    live, over = 0, []
    for delta in change:
        live += delta
        over.append(live > height)
    nodes = {b.id.split(KERNEL_TAG)[0] for b in problem.buffers
             if KERNEL_TAG in b.id and any(over[b.start:b.end])}
    return Problem([b for b in problem.buffers
                    if KERNEL_TAG not in b.id or b.id.split(KERNEL_TAG)[0] not in nodes],
                   name=problem.name)
