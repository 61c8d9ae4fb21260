"""The function generated for one plan: straight-line Python that runs every node in its slot.

:func:`generate` writes one Python function for the plan: one statement per node
(:mod:`~tensorarena.runtime.node_statements`), calling the op (or its out variant, the raw
``torch._C`` callable with its slot bound as a global) and dropping each value after its last
use, as ``torch.fx`` code generation does. Out calls sit in ``try`` blocks (free in CPython 3.11
until something raises): an out variant that refuses its slot falls back to the ``copy`` path and
the node is reported, never a crash. Which path each node takes was decided before planning
(:func:`~tensorarena.runtime.lowering.classify`). A long function is compiled by a child
interpreter (:func:`~tensorarena.runtime.source_compile.compile_source`): its syntax tree would
have been the process's peak.

With ``poison=True`` every buffer's bytes are overwritten (``0xFF``: NaN in floating point) right
after its last use and the whole arena before the first node, so a lifetime computed too short,
or a read of bytes never written, changes the results instead of passing unnoticed.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensorarena.planning.graph_problem import GraphProblem, TensorSpec
from tensorarena.runtime.kernel_arena import KernelHooks
from tensorarena.runtime.materialize import slot
from tensorarena.runtime.node_statements import SourceWriter, resolve_target, write_statement
from tensorarena.runtime.source_compile import compile_source

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.runtime.lowering import Lowering

__all__ = ["POISON_BYTE", "Generated", "generate", "packed"]

POISON_BYTE = 0xFF


@dataclass
class Generated:
    """The generated function and what it needs: ``run(inputs) -> outputs`` (flat lists), its
    source (for debugging), the slot tensors by buffer id, the nodes whose out variant
    failed at run time (filled in by the function itself; the program then re-lowers them),
    and the generated function's globals (``namespace``: what :meth:`release` clears; ``run``
    may be a wrapper defined elsewhere, whose globals are its module's)."""

    run: Callable[[list[Any]], Any]
    #: the source, compressed (:func:`packed`): read :attr:`source`; kept for debugging only,
    #: it was the largest single object a built program held (GPT-2 124M: 44 KiB)
    packed_source: bytes
    slots: dict[str, torch.Tensor]
    failed: dict[str, str]
    namespace: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """The generated source (made again from its compressed copy)."""
        return zlib.decompress(self.packed_source).decode() if self.packed_source else ""

    def release(self) -> None:
        """Drop the code's references to its memory now: the generated function is in its own
        globals (a cycle only the garbage collector would break), and they hold the slots; a
        wrapper (``run`` of a handed-over tail) holds its block. Released code never runs
        again: its memory may already serve other code."""
        self.namespace.clear()
        self.slots.clear()
        self.run = _released


def packed(source: str) -> bytes:
    """``source`` compressed, as :class:`Generated` keeps it (``b""`` for none)."""
    return zlib.compress(source.encode(), 6) if source else b""


def _released(inputs: list[Any]) -> Any:
    raise RuntimeError("internal error: tensorarena ran generated code it had released")


def generate(
    graph: torch.fx.Graph,
    owner: Any,
    gp: GraphProblem,
    lowering: Lowering,
    offsets: Mapping[str, int],
    memory: torch.Tensor,
    *,
    poison: bool = False,
    annotate: bool = False,
    pool_tensor: Callable[[str], Any] | None = None,
    kernel: KernelHooks | None = None,
    tail: tuple[int, torch.Tensor] | None = None,
) -> Generated:
    """Write and compile the function that runs ``graph`` with planned buffers at ``offsets``
    in ``memory``. ``owner`` resolves ``get_attr``/``call_module`` targets (the graph's module);
    ``pool_tensor(buffer)`` returns the callable that allocates a pooled buffer at call time.
    ``annotate`` wraps each node in a profiler range named ``tensorarena:<path>:<node>`` (for
    :mod:`~tensorarena.runtime.measure`, which attributes allocations to paths). ``kernel``
    arms the kernel-allocation shim around the nodes it names
    (:mod:`~tensorarena.runtime.kernel_arena`); offsets of buffers that are no tensor of the
    graph (its planned kernel allocations) get no slot. ``tail=(start, block)``: buffers at
    offsets from ``start`` on live in ``block`` instead, at ``offset - start``
    (:mod:`~tensorarena.runtime.output_tail`)."""
    import torch

    writer = SourceWriter()
    writer.note = kernel.note if kernel is not None else None
    slots: dict[str, torch.Tensor] = {}
    failed: dict[str, str] = {}
    specs: dict[str, TensorSpec] = gp.tensors
    def place(offset: int) -> tuple[torch.Tensor, int]:  # the block a byte offset lives in
        if tail is not None and offset >= tail[0]:
            return tail[1], offset - tail[0]
        return memory, offset

    for buffer_id, offset in offsets.items():
        if buffer_id in specs:
            slots[buffer_id] = slot(*place(offset), specs[buffer_id])
    nodes = list(graph.nodes)
    index = {node: i for i, node in enumerate(nodes)}
    last_use = _last_uses(nodes, index)
    deaths: dict[int, list[str]] = {}
    if poison:
        ends = {b.id: b.end for b in gp.problem.buffers if b.id in slots}
        for buffer_id, end in ends.items():
            deaths.setdefault(end - 1, []).append(buffer_id)
    writer.globals.update(
        _failed=failed, _poison=_poison_bytes, _annotate=torch.profiler.record_function
    )
    lines = writer.lines
    placeholders = [f"v{index[n]}" for n in nodes if n.op == "placeholder"]
    lines.append("def run(inputs):")
    if placeholders:
        lines.append(f"    {', '.join(placeholders)}, = inputs")
    if poison:
        lines.append(f"    _poison({writer.const(memory)})")
        if tail is not None:
            lines.append(f"    _poison({writer.const(tail[1])})")
    for i, node in enumerate(nodes):
        if node.op == "placeholder":
            pass
        elif node.op == "output":
            lines.append(f"    return {writer.expr(node.args[0], index)}")
        elif node.op == "get_attr":
            lines.append(f"    v{i} = {writer.const(resolve_target(owner, str(node.target)))}")
        else:
            at = len(lines)
            write_statement(writer, node, i, index, lowering, slots, failed, pool_tensor, owner)
            if kernel is not None and node.name in kernel.objects:
                _arm_around(writer, at, kernel, node.name, memory)
            if annotate:
                path = lowering.paths.get(node.name)
                label = f"tensorarena:{path.path if path else 'other'}:{node.name}"
                lines[at:] = [f"    with _annotate({label!r}):"] + ["    " + s for s in lines[at:]]
        for buffer_id in deaths.get(i, ()):
            within, at = place(offsets[buffer_id])
            whole = within[at : at + specs[buffer_id].nbytes]
            lines.append(f"    _poison({writer.const(whole)})")
        dead = [f"v{index[n]}" for n in last_use.get(i, ())]
        if node.op != "output" and not node.users and node.op != "placeholder":
            dead.append(f"v{i}")
        if dead and node.op != "output":
            lines.append(f"    del {', '.join(dead)}")
    source = "\n".join(lines) + "\n"
    namespace = dict(writer.globals)
    exec(compile_source(source, f"<tensorarena planned {gp.name or 'program'}>"), namespace)
    run = namespace["run"] if kernel is None else kernel.installed(namespace["run"])
    return Generated(run, packed(source), slots, failed, namespace)


def _arm_around(writer: SourceWriter, at: int, kernel: KernelHooks, node: str,
                memory: torch.Tensor) -> None:
    """Wrap the statement lines from ``at`` in arming the shim for ``node`` (disarmed in a
    ``finally``: an exception never leaves it armed)."""
    lines = writer.lines
    obj = writer.const(kernel.objects[node])
    base = f", {memory.data_ptr()}" if kernel.serve else ""
    body = ["    " + s for s in lines[at:]]
    lines[at:] = [f"    {writer.const(kernel.begin)}({obj}{base})", "    try:", *body,
                  "    finally:", f"        {writer.const(kernel.end)}({obj})"]


def _poison_bytes(memory: torch.Tensor) -> None:
    memory.fill_(POISON_BYTE)


def _last_uses(
    nodes: list[torch.fx.Node], index: Mapping[torch.fx.Node, int]
) -> dict[int, list[torch.fx.Node]]:
    """Node index → the values used for the last time there (placeholders included)."""
    last: dict[torch.fx.Node, int] = {}
    for i, node in enumerate(nodes):
        for used in node.all_input_nodes:
            last[used] = i
    by_step: dict[int, list[torch.fx.Node]] = {}
    for used, i in last.items():
        by_step.setdefault(i, []).append(used)
    return by_step
