"""``outputs="handover"``: outputs planned into a tail of the arena that each call hands over.

A program's arena is split at a *tail start* ``T``: ``[0, T)`` is the persistent arena, the
workspace's block, held across calls; ``[T, H)`` is the *tail*, a block of ``H - T`` bytes from
the same resource, one per call whose outputs are kept. The graph's outputs are planned at the
bottom of the tail (packed: they all live to the end of the call), and intermediates whose
lifetimes fit around them (those that die before the later outputs are made) are planned there
too, where they lower the peak of the persistent part. When the call returns, the tail holds the
outputs only and is handed to the caller with them; a call made while the caller still holds
any of them (or a view, or their storage) takes a new tail, so nothing a later call writes can
alias an output.

The peak of a call is then ``H`` (the persistent arena and one tail), not the arena plus the
outputs made on top of it (``outputs="fresh"``); the caller keeps ``H - T`` bytes per call it
keeps outputs of (the outputs, and the alignment padding between them), not a whole arena
(``outputs="arena"``).

**The plan** (:func:`split_plan`): outputs first, at the lowest offsets of the tail; then, while
the persistent part's peak of live bytes is at a time where a buffer live then fits in the tail
beside what is there already (first fit, over time), the largest such buffer moves to the tail.
The rest is planned by the program's planner into ``[0, T)``. No buffer crosses ``T``: the two
parts are separate blocks. Kernels' own allocations (:mod:`~tensorarena.runtime.kernel_arena`)
move like any buffer: the shim serves them at ``base + offset`` from its node's script, so the
entries of those in the tail are written at each call, relative to the persistent arena's
address (modulo 2**64, as the shim adds).

**The code** (:func:`with_tail`): generated once over a first tail. The outputs are handed over
as new views of the tail (``aten.alias``), so that the caller's tensors count as references to
it, read as :mod:`~tensorarena.runtime.held_arenas` reads its blocks (the storage's use count
and the references to its storage object, against the code's own). A call whose caller still
holds the last tail takes a new one and points every tensor of the code over the old one at it
(``Tensor.set_``: the code keeps the same tensor objects; the bases the slots were cut from
too, else they would keep the old tail): the old tail is then the caller's alone. A call whose
caller dropped the last outputs takes the same tail again, with no allocation and nothing to
re-point: a loop that drops each call's outputs before the next costs one block for all calls
(and the runtime keeps that idle tail between calls, as it keeps the arena).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorarena._optional import load_torch
from tensorarena.errors import PlanVerificationError
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.runtime.generated_code import Generated
from tensorarena.runtime.held_arenas import storage_uses
from tensorarena.runtime.kernel_arena import FORWARD, KERNEL_TAG, KernelHooks
from tensorarena.runtime.materialize import block

if TYPE_CHECKING:
    import torch

    from tensorarena.memory.resource import MemoryResource

__all__ = ["kernel_patches", "split_plan", "tail_bytes", "tail_start", "with_tail"]


# ----------------------------------------------------------------------------------------------
# Planning
# ----------------------------------------------------------------------------------------------


def _round_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass
class _Tail:
    """Buffers placed in the tail at offsets relative to its start, first fit over time."""

    placed: list[tuple[Buffer, int]]

    def fit(self, buffer: Buffer, limit: int | None) -> int | None:
        """The lowest offset where ``buffer`` fits beside the buffers live with it (below
        ``limit`` if one is given), or ``None``."""
        busy = sorted((at, at + b.nbytes) for b, at in self.placed
                      if b.start < buffer.end and buffer.start < b.end)
        offset = 0
        for low, high in busy:
            if offset + buffer.nbytes <= low:
                break
            offset = max(offset, _round_up(high, buffer.alignment))
        if limit is not None and offset + buffer.nbytes > limit:
            return None
        return offset

    def add(self, buffer: Buffer, limit: int | None = None) -> bool:
        offset = self.fit(buffer, limit)
        if offset is None:
            return False
        self.placed.append((buffer, offset))
        return True

    @property
    def height(self) -> int:
        return max((at + b.nbytes for b, at in self.placed), default=0)


def split_plan(problem: Problem, outputs: Collection[str],
               plan: Callable[[Problem], Plan]) -> Plan:
    """A plan of ``problem`` whose ``outputs`` are at the bottom of a tail above every other
    buffer of the persistent part (module docstring); ``plan`` plans the persistent part.
    Without outputs among the buffers it is ``plan(problem)``."""
    outs = [b for b in problem.buffers if b.id in outputs]
    if not outs:
        return plan(problem)
    alignment = max(b.alignment for b in problem.buffers)
    tail = _Tail([])
    for buffer in sorted(outs, key=lambda b: (b.start, -b.nbytes)):
        tail.add(buffer)
    limit = _round_up(tail.height, alignment)
    rest = [b for b in problem.buffers if b.id not in outputs]
    moved = _fill(tail, rest, limit)
    persistent = plan(Problem([b for b in rest if b.id not in moved], name=problem.name))
    if moved:  # never worse than the outputs' tail alone
        alone = plan(Problem(rest, name=problem.name))
        if _round_up(alone.height, alignment) <= _round_up(persistent.height, alignment):
            persistent, tail = alone, _Tail([p for p in tail.placed if p[0].id in outputs])
    start = _round_up(persistent.height, alignment)
    offsets = persistent.as_dict()
    offsets.update({b.id: start + at for b, at in tail.placed})
    return Plan(problem, tuple(offsets[b.id] for b in problem.buffers),
                planner=persistent.planner, optimal=False, statistics=persistent.statistics)


def _fill(tail: _Tail, rest: list[Buffer], limit: int) -> set[str]:
    """Move buffers of ``rest`` into ``tail`` (within ``limit`` bytes), each time the largest
    that fits of those live when the bytes left live peak, until none fits there; return the
    ids moved. (A move at one of several equal peaks lowers nothing alone: :func:`split_plan`
    keeps the plan without moves when it is not higher.)"""
    if not rest:
        return set()
    steps = max(b.end for b in rest) + 1
    change = np.zeros(steps + 1, dtype=np.int64)
    for b in rest:
        change[b.start] += b.nbytes
        change[b.end] -= b.nbytes
    live = np.cumsum(change)[:steps]
    candidates = [b for b in rest if 0 < b.nbytes <= limit]
    moved: set[str] = set()
    while candidates:
        at = int(np.argmax(live))
        here = sorted((b for b in candidates if b.start <= at < b.end),
                      key=lambda b: -b.nbytes)
        chosen = next((b for b in here if tail.add(b, limit)), None)
        if chosen is None:
            break
        live[chosen.start:chosen.end] -= chosen.nbytes
        moved.add(chosen.id)
        candidates.remove(chosen)
    return moved


def tail_start(plan: Plan, outputs: Collection[str]) -> int:
    """Where ``plan``'s tail starts (its lowest output; the height without outputs). Raises
    :class:`PlanVerificationError` if a buffer below it crosses it (not a split plan)."""
    offsets = [o for o, b in zip(plan.offsets, plan.problem.buffers, strict=True)
               if b.id in outputs]
    start = min(offsets, default=plan.height)
    for offset, buffer in zip(plan.offsets, plan.problem.buffers, strict=True):
        if offset < start < offset + buffer.nbytes:
            raise PlanVerificationError(
                f"buffer {buffer.id!r} at [{offset}, {offset + buffer.nbytes}) crosses the "
                f"tail's start {start}: the plan was not made by split_plan"
            )
    return start


def tail_bytes(plan: Plan, outputs: Collection[str]) -> int:
    """The bytes of ``plan``'s tail: what a caller keeping a call's outputs keeps."""
    return plan.height - tail_start(plan, outputs)


# ----------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------


#: Where a kernel allocation in the tail is written in its node's script: ``(script, byte
#: position of its offset, its offset in the tail)``.
Patch = tuple[bytearray, int, int]
_HEADER_BYTES, _ENTRY_BYTES, _ADDRESSES = 32, 16, 1 << 64


def kernel_patches(kernel: KernelHooks | None, start: int) -> list[Patch]:
    """The script entries of ``kernel``'s nodes whose allocation is planned in the tail
    (``start``: the tail's offset in the plan). Raises :class:`PlanVerificationError` for a
    served entry left unpatched that reaches past ``start``: the shim would write it beyond the
    persistent arena, into memory no plan gave it."""
    if kernel is None or not kernel.serve:
        return []
    patches = []
    for node, script in kernel.objects.items():
        (count,) = struct.unpack_from("<Q", script, _HEADER_BYTES - 8)
        for k in range(count):
            at = _HEADER_BYTES + _ENTRY_BYTES * k
            # The plan's offset, not the plan's buffers: an allocation served in its result's
            # slot (KernelRecording.in_slots) is no buffer of the plan, and its slot can be in
            # the tail: the slot of one recorded in the persistent part moves there when the
            # plan is made again with the kernels' allocations (BERT-base, 2 x 256: layer_norm_2's
            # result). Looked up among the plan's buffers, such an entry went unpatched and was
            # served at the arena's address plus the slot's offset, past the end of the
            # persistent block: the layer norm wrote 1.5 MiB over whatever lay there (issue 22).
            offset = kernel.offsets.get(f"{node}{KERNEL_TAG}{k}")
            if offset is not None and offset >= start:
                patches.append((script, at + 8, offset - start))
                continue
            nbytes, served = struct.unpack_from("<2Q", script, at)
            if served != FORWARD and served + nbytes > start:
                raise PlanVerificationError(
                    f"{node}'s kernel allocation {k} ({nbytes} bytes at offset {served}) is "
                    f"not moved with the tail but ends past its start {start}"
                )
    return patches


def with_tail(make_code: Callable[[tuple[int, torch.Tensor] | None], Generated], start: int,
              nbytes: int, resource: MemoryResource | None, device: str,
              persistent: torch.Tensor, patches: Sequence[Patch] = (),
              keep_idle: Callable[[Any], None] | None = None) -> Generated:
    """The code ``make_code(tail)`` generates over a first tail, run with a tail no caller holds
    at every call (module docstring). ``start``: where the tail starts in the plan;
    ``nbytes``: its size (0: no tail, the code as generated); ``persistent``: the arena held
    across calls, which no output may view (one that did would be copied out: the plan puts
    every output in the tail, so this is a guard, never the path taken); ``patches``: the
    kernel allocations served in the tail (:func:`kernel_patches`); ``keep_idle``: called with
    the tail's state, whose ``idle_blocks()`` is the tail when no caller holds it
    (:meth:`~tensorarena.runtime.workspace.Workspace.keep_idle`)."""
    if nbytes == 0:
        return make_code(None)
    first = block(nbytes, resource, device=device)
    code = make_code((start, first))
    tail = _TailRun(first, code, nbytes, resource, device, persistent, patches)
    del first
    tail.settle()
    if keep_idle is not None:
        keep_idle(tail)
    # The tail's slots move between calls: the layout checks see the persistent ones.
    moving = {id(tensor) for tensor, *_ in tail.views}
    slots = {k: t for k, t in code.slots.items() if id(t) not in moving}
    return Generated(tail.run, code.packed_source, slots, code.failed, code.namespace)


class _TailRun:
    """The state of :func:`with_tail`'s code: the tail its tensors view now, and how many
    references to it are the code's own (:func:`~tensorarena.runtime.held_arenas.storage_uses`,
    taken when they were pointed at it, before any output existed)."""

    def __init__(self, first: torch.Tensor, code: Generated, nbytes: int,
                 resource: MemoryResource | None, device: str, persistent: torch.Tensor,
                 patches: Sequence[Patch]) -> None:
        th = load_torch()
        address = first.untyped_storage().data_ptr()
        #: every tensor of the code over the tail and the bases they keep, with their places
        self.views = [(t, t.storage_offset(), tuple(t.shape), t.stride())
                      for t in _over(_tensors(code.namespace), address)]
        self.current = first
        self.own = 0
        self._inner = code.run
        self._nbytes, self._resource, self._device = nbytes, resource, device
        self._arena = persistent.untyped_storage().data_ptr()
        self._patches = patches
        self._alias = th.ops.aten.alias.default
        self.taken = 0  #: tails made after the first (each when the caller held the last)

    def settle(self) -> None:
        """Count the code's own references to the current tail. Every reference to it must be
        a view the code re-points: one made elsewhere would keep writing into a tail handed
        over."""
        th = load_torch()
        tensors = {id(t) for t, *_ in self.views} | {id(self.current)}
        uses = int(th._C._storage_Use_Count(self.current.untyped_storage()._cdata))
        if uses != len(tensors) + 1:  # the views, the block, the storage object just made
            raise PlanVerificationError(
                f"the tail is referenced {uses} times, not by the code's {len(self.views)} "
                "tensors, the block and its storage only: a view the code cannot move"
            )
        self.own = storage_uses(self.current)

    def idle_blocks(self) -> list[torch.Tensor]:
        """The current tail, if no caller holds it (or a view of it)."""
        return [self.current] if storage_uses(self.current) <= self.own else []

    def _take(self) -> None:
        """A new tail for the code: the caller holds the last one."""
        tail = block(self._nbytes, self._resource, device=self._device)
        storage = tail.untyped_storage()
        for tensor, offset, size, stride in self.views:
            tensor.set_(storage, offset, size, stride)
        del storage
        self.current = tail
        self.taken += 1
        self.settle()

    def run(self, inputs: list[Any]) -> Any:
        if storage_uses(self.current) > self.own:
            self._take()
        # At every call: other code over the same scripts (verify's, a traced call's) writes
        # its own tail's addresses there.
        to_tail = self.current.data_ptr() - self._arena
        for script, at, offset in self._patches:
            struct.pack_into("<Q", script, at, (to_tail + offset) % _ADDRESSES)
        outputs = self._inner(inputs)
        pointer, arena, alias = self.current.data_ptr(), self._arena, self._alias

        def handed(t: torch.Tensor) -> torch.Tensor:
            held = t.untyped_storage().data_ptr()
            if held == pointer:
                return alias(t)  # type: ignore[no-any-return]  # a new tensor: it counts
            return t.clone() if held == arena else t

        return _map_tensors(outputs, handed)


def _over(tensors: list[torch.Tensor], address: int) -> list[torch.Tensor]:
    """The tensors over the storage at ``address`` and every base they keep alive (a slot is
    a view of the dtype view it was cut from: left alone, that one would keep the first tail)."""
    found = {id(t): t for t in tensors if t.untyped_storage().data_ptr() == address}
    stack = list(found.values())
    while stack:
        base = stack.pop()._base
        if base is not None and id(base) not in found:
            found[id(base)] = base
            stack.append(base)
    return list(found.values())


def _tensors(namespace: dict[str, Any]) -> list[torch.Tensor]:
    torch = load_torch()
    return [v for v in namespace.values() if isinstance(v, torch.Tensor)]


def _map_tensors(outputs: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``outputs`` with ``fn`` applied to every tensor: the flat tuple or list a generated
    function returns without pytree's cost per call, anything else through pytree."""
    torch = load_torch()
    if isinstance(outputs, torch.Tensor):
        return fn(outputs)
    if type(outputs) in (tuple, list) and not any(
            isinstance(v, (tuple, list, dict)) for v in outputs):
        return type(outputs)(fn(v) if isinstance(v, torch.Tensor) else v for v in outputs)
    from torch.utils import _pytree as pytree

    return pytree.tree_map_only(torch.Tensor, fn, outputs)
