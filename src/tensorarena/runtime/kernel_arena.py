"""Kernels' own CPU allocations served from the planned arena.

A planned program writes every intermediate into its slot, but kernels still allocate memory of
their own while they run: ``native_layer_norm.out`` makes its three results elsewhere and copies
them, attention without an out variant makes its result (copied into the slot), a convolution
its im2col columns. Python cannot replace torch's CPU allocator; torch's CPU allocator shim
(:mod:`tensorarena.interop.torch_cpu_shim`, compiled on first use and shared with
:mod:`tensorarena.torch`) does: an ``at::Allocator`` installed for the duration of a call that
forwards (to the route of :func:`tensorarena.torch.use` where one is set, else to the previous
allocator) except on the calling thread while a node has armed it.

1. The first call of a shape *records* (:class:`KernelRecording`): around every op node, the
   sizes of the allocations the node's kernels made on the calling thread, in order, and when
   each was made and freed (if it was before the node ended).
2. Those freed within their node become planned buffers live while they were, within the
   node's step (:func:`temporaries`): the planner gives them bytes no other buffer uses at that
   time (bytes of the arena idle at that step where there are some, more arena otherwise), and
   the program is planned again with them.
3. Every later call arms the shim before such a node with its *script* (:class:`KernelScripts`:
   the recorded sizes and each one's offset in the arena, in order) and disarms it after: an
   allocation of the next expected size gets its planned address, everything else forwards to
   torch's allocator. The first allocation that differs from the recording ends serving for the
   node; each address is handed out at most once per node and only while the node runs.

Served blocks never reach torch's allocator, so the profiler (and ``bench exec``'s allocator
counts) no longer sees them. A served block still alive when its node ends (*escaped*: a kernel
kept it, which the recording never showed) is counted, and its node is no longer armed.

Where the shim cannot be built (no C++ compiler, ``ninja`` or torch headers), or
``$TENSORARENA_KERNEL_ARENA`` is ``0`` (which turns off this use of it only), :func:`unavailable`
says why and programs run as without it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorarena.interop import torch_cpu_shim
from tensorarena.planning.problem import Buffer, Problem

__all__ = [
    "KernelHooks",
    "KernelRecording",
    "KernelScripts",
    "extension",
    "temporaries",
    "unavailable",
]

#: Alignment of a planned kernel allocation: that of torch's CPU allocator.
KERNEL_ALIGNMENT = 64
#: In the id of every planned kernel allocation: ``<node>#kernel<k>``.
KERNEL_TAG = "#kernel"
#: The offset that marks a recorded allocation to forward (it outlived its node).
FORWARD = 2**64 - 1
_HEADER = struct.Struct("<4Q")  # served, forwarded, escaped, number of entries


def extension() -> Any:
    """The compiled shim (built on first use), or ``None`` where it is unavailable."""
    return None if unavailable() else torch_cpu_shim.extension()


def unavailable() -> str:
    """Why the shim cannot serve kernels here, or ``""`` where it can (builds it on first
    use)."""
    if os.environ.get("TENSORARENA_KERNEL_ARENA", "") == "0":
        return "turned off ($TENSORARENA_KERNEL_ARENA=0)"
    return torch_cpu_shim.unavailable()


# ----------------------------------------------------------------------------------------------
# Recording and planning
# ----------------------------------------------------------------------------------------------


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class KernelHooks:
    """What generated code calls around a node named in ``objects``: ``begin(obj[, base])``
    before it and ``end(obj)`` after (in a ``finally``); ``serve`` passes the arena's address
    to ``begin``. The whole call runs with the shim installed (:meth:`installed`);
    ``escaped()`` is called after a call in which a served block outlived its node. Serving,
    ``offsets`` is :attr:`KernelScripts.offsets` (where each served entry lies in the plan)."""

    begin: Callable[..., Any]
    end: Callable[[Any], Any]
    objects: Mapping[str, Any]
    serve: bool
    escaped: Callable[[], None] = _nothing
    #: record mode: ``note(node, result)`` around a copy-path op's call
    note: Callable[[str, Any], Any] | None = None
    offsets: Mapping[str, int] = field(default_factory=dict)

    def installed(self, run: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """``run`` with the shim installed as torch's CPU allocator while it runs."""
        module = extension()
        install, uninstall, escaped = module.install, module.uninstall, self.escaped

        def run_installed(inputs: list[Any]) -> Any:
            before = install()
            try:
                return run(inputs)
            finally:
                if uninstall() != before:
                    escaped()

        return run_installed

    @classmethod
    def serving(cls, scripts: KernelScripts, escaped: Callable[[], None]) -> KernelHooks:
        """Hooks that serve ``scripts`` (steady state)."""
        module = extension()
        return cls(module.arm, module.disarm, scripts.armed(), True, escaped,
                   offsets=scripts.offsets)


@dataclass
class KernelRecording:
    """What one recorded call's kernels allocated: node name → ``(nbytes, made, freed,
    address)`` per allocation of the calling thread, in order, times counted in allocation and
    free events of the node's blocks, ``freed`` ``None`` for a block still live when the node
    ended. ``results``: for nodes on the copy path, the layout of each result the op returned
    (``(address, shape, strides, dtype)``, ``None`` for a non-tensor), so that an allocation
    that is a result copied into a slot of the same layout can be served in that slot.
    Both are filled by the generated code (:meth:`hooks`)."""

    logs: dict[str, list[tuple[int, int, int | None, int]]] = field(default_factory=dict)
    results: dict[str, list[tuple[int, tuple[int, ...], tuple[int, ...], Any] | None]] = field(
        default_factory=dict)

    def log(self, node: str) -> list[tuple[int, int, int | None, int]]:
        """The list the node's recording is appended to."""
        return self.logs.setdefault(node, [])

    def note(self, node: str, result: Any) -> Any:
        """Keep the layout of the op's results (the generated copy path calls this); return
        ``result``."""
        import torch

        values = result if isinstance(result, (tuple, list)) else [result]
        self.results[node] = [
            (v.data_ptr(), tuple(v.shape), tuple(v.stride()), v.dtype)
            if isinstance(v, torch.Tensor) and v.storage_offset() == 0 else None
            for v in values]
        return result

    def in_slots(self, names: Mapping[str, Sequence[str | None]],
                 slots: Mapping[str, Any], starts: Mapping[str, int]) -> dict[str, str]:
        """Allocations that are a copy-path result of the same dense layout as its slot: their
        buffer id (``<node>#kernel<k>``) → the slot's (its buffer id). Served there, the op
        writes its result into the slot itself (the copy then copies each byte onto itself);
        they need no bytes of their own. ``names``: each node's result names; ``slots``: the
        recorded call's slot tensors by buffer id, ``starts`` the address of each buffer
        (a slot starting elsewhere in its buffer is not taken)."""
        found: dict[str, str] = {}
        for node, results in self.results.items():
            by_address = {address: k for k, (_, _, freed, address) in enumerate(self.logs.get(
                node, ())) if freed is not None}
            for name, result in zip(names.get(node, ()), results, strict=False):
                target = slots.get(name) if name is not None else None
                if name is None or result is None or target is None or (
                        result[0] not in by_address):
                    continue
                k = by_address[result[0]]
                nbytes = self.logs[node][k][0]
                same = (result[1:] == (tuple(target.shape), tuple(target.stride()),
                                       target.dtype))
                if same and _dense(target.shape, target.stride()) and (
                        target.data_ptr() == starts[name]) and (
                        nbytes <= target.numel() * target.element_size()):
                    found[f"{node}{KERNEL_TAG}{k}"] = name
        return found

    def hooks(self, nodes: Iterable[str]) -> KernelHooks:
        """Hooks that record ``nodes`` into :attr:`logs` and :attr:`results` (the first call
        of a shape)."""
        module = extension()
        record = module.record
        return KernelHooks(lambda log: record(), module.recorded,
                           {node: self.log(node) for node in nodes}, False, note=self.note)


def _dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` covers exactly its elements' bytes from its
    first element on (contiguous in some order of its dimensions: a transposed result too)."""
    expected = 1
    for size, stride in sorted((p for p in zip(shape, strides, strict=True) if p[0] != 1),
                               key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def temporaries(recording: KernelRecording, steps: Mapping[str, int],
                problem: Problem, in_slots: Mapping[str, str] | None = None,
                ) -> tuple[Problem, int]:
    """``problem`` with the recorded allocations freed within their node added as buffers
    named ``<node>#kernel<k>`` (``k``: the allocation's place in the node's sequence), but
    those of ``in_slots`` (served in their result's slot, :meth:`KernelRecording.in_slots`):
    their slot starts when they were made instead, as nothing is written into it before.

    Time is refined so that a node's allocations live only while they did: step ``i`` of
    ``problem`` becomes ``[i * T, (i + 1) * T)`` (``T``: one more than the most allocation and
    free events of one node) and an allocation made at event ``a`` of node ``i`` and freed at
    event ``b`` lives ``[i * T + a, i * T + b)``. Every buffer of ``problem`` live at step ``i``
    covers the whole node, so it overlaps each of the node's allocations, as it did in memory.
    ``steps`` maps node names to their step. Returns the problem and ``T``."""
    skip = dict(in_slots or {})
    ticks = 1 + max((freed for log in recording.logs.values() for _, _, freed, _ in log
                     if freed is not None), default=0)
    later = {slot: recording.logs[kernel.split(KERNEL_TAG)[0]][int(kernel.split(KERNEL_TAG)[1])][1]
             for kernel, slot in skip.items()}
    buffers = [Buffer(b.id, b.start * ticks + later.get(b.id, 0), b.end * ticks, b.nbytes,
                      b.alignment) for b in problem.buffers]
    for node, log in recording.logs.items():
        for k, (nbytes, made, freed, _) in enumerate(log):
            if freed is not None and nbytes > 0 and f"{node}{KERNEL_TAG}{k}" not in skip:
                start = steps[node] * ticks
                buffers.append(Buffer(f"{node}{KERNEL_TAG}{k}", start + made, start + freed,
                                      nbytes, KERNEL_ALIGNMENT))
    return Problem(buffers, name=problem.name), ticks


@dataclass
class KernelScripts:
    """The scripts of one planned shape: per node, a ``bytearray`` the shim reads (a header of
    counters the shim adds to, then ``(nbytes, offset)`` per recorded allocation, ``offset``
    :data:`FORWARD` for one to forward). Offsets are from the arena's start; the generated code
    passes the arena's address when it arms a node. Counters accumulate over every call."""

    scripts: dict[str, bytearray] = field(default_factory=dict)
    escaped_nodes: set[str] = field(default_factory=set)
    #: a node escaped since the code was generated: generate it again without that node
    stale: bool = False
    #: time steps of the plan per step of the graph (:func:`temporaries`)
    ticks: int = 1
    #: the plan's offset of every served entry (``<node>#kernel<k>``), one served in its
    #: result's slot at that slot's: what the scripts hold as built, before a handed-over tail
    #: rewrites the entries it holds (:func:`~tensorarena.runtime.output_tail.kernel_patches`)
    offsets: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, recording: KernelRecording, offsets: Mapping[str, int]) -> KernelScripts:
        """Scripts for the nodes with at least one planned allocation (``offsets``: buffer id →
        offset, the plan's, which include the :func:`temporaries`, and those served in their
        slot)."""
        scripts: dict[str, bytearray] = {}
        served: dict[str, int] = {}
        for node, log in recording.logs.items():
            entries = [(nbytes, offsets.get(f"{node}{KERNEL_TAG}{k}", FORWARD))
                       for k, (nbytes, _, _, _) in enumerate(log)]
            if all(offset == FORWARD for _, offset in entries):
                continue
            script = bytearray(_HEADER.pack(0, 0, 0, len(entries)))
            for k, (nbytes, offset) in enumerate(entries):
                script += struct.pack("<2Q", nbytes, offset)
                if offset != FORWARD:
                    served[f"{node}{KERNEL_TAG}{k}"] = offset
            scripts[node] = script
        return cls(scripts, offsets=served)

    def armed(self) -> dict[str, bytearray]:
        """The scripts the generated code arms: all but those of nodes that escaped."""
        return {node: s for node, s in self.scripts.items() if node not in self.escaped_nodes}

    def counters(self) -> tuple[int, int, int]:
        """``(served, forwarded, escaped)`` allocations over every call so far."""
        served = forwarded = escaped = 0
        for script in self.scripts.values():
            s, f, e, _ = _HEADER.unpack_from(script)
            served, forwarded, escaped = served + s, forwarded + f, escaped + e
        return served, forwarded, escaped

    def note_escapes(self) -> None:
        """Stop arming nodes whose served blocks outlived them (:attr:`stale` if any is new)."""
        new = {node for node, s in self.scripts.items()
               if _HEADER.unpack_from(s)[2] and node not in self.escaped_nodes}
        self.escaped_nodes |= new
        self.stale = self.stale or bool(new)

    @property
    def nodes(self) -> Iterable[str]:
        """Nodes with a script."""
        return self.scripts.keys()
