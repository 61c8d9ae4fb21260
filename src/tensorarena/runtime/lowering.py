"""From an FX graph and its plan to straight-line Python that runs every node in its slot.

Two steps, both once per specialisation of a program (not per call):

1. :func:`classify` decides, before planning, which path every node takes and which buffers are
   left out of the plan (*dynamic*), with a reason for each:

   ``out``      every result is a planned buffer and the op has an out variant
                (:func:`~tensorarena.runtime.ops.out_variant`): it writes into its slots;
   ``copy``     planned results, no usable out variant: the op runs as usual and its results are
                copied into their slots (the op's own allocation lives for one node only);
   ``alias``    views and in-place ops: they run as they are, over whatever storage they alias;
   ``dynamic``  results outside the arena: graph outputs (handed to the caller, see
                :mod:`~tensorarena.runtime.program`; planned instead with
                ``planned_outputs``), and, with ``unplaceable="dynamic"``
                (or ``"auto"``, for short-lived ones), results of ops without an out variant;
   ``pool``     results whose size follows a dimension declared *growing*: written through the
                out variant into a block of the dynamic pool, sized at each call;
   ``other``    no tensor result: shape arithmetic, assertions, picking one result of several.

2. :func:`generate` writes one Python function for the plan: one statement per node, calling
   the op (or its out variant, the raw ``torch._C`` callable with its slot bound as a global)
   and dropping each value after its last use, as ``torch.fx`` code generation does. Out calls
   sit in ``try`` blocks (free in CPython 3.11 until something raises): an out variant that
   refuses its slot falls back to the ``copy`` path and the node is reported, never a crash.

With ``poison=True`` every buffer's bytes are overwritten (``0xFF``: NaN in floating point) right
after its last use and the whole arena before the first node, so a lifetime computed too short,
or a read of bytes never written, changes the results instead of passing unnoticed.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tensorarena.planning._torch_graph import _is_tensor_like, _meta_value, _op_name
from tensorarena.planning.graph_problem import GraphProblem, TensorSpec
from tensorarena.planning.torch_frontend import _element_names
from tensorarena.runtime.in_slot import (
    clone_in_slot,
    embedding_backward_in_slot,
    embedding_dense_backward_into,
    embedding_in_slot,
    written_in_slot,
)
from tensorarena.runtime.kernel_arena import KernelHooks
from tensorarena.runtime.materialize import slot
from tensorarena.runtime.ops import out_differs, out_variant
from tensorarena.runtime.scalars import hoisted, mean_as_sum

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["PATHS", "Lowering", "NodePath", "Unplaceable", "classify", "generate"]

#: Every path a node can take, in report order.
PATHS = ("out", "copy", "alias", "dynamic", "pool", "other")
Path = Literal["out", "copy", "alias", "dynamic", "pool", "other"]
Unplaceable = Literal["auto", "copy", "dynamic"]
#: With ``unplaceable="auto"``, results read for at most this many steps stay dynamic.
SHORT_LIVED_STEPS = 3

POISON_BYTE = 0xFF


@dataclass(frozen=True)
class NodePath:
    """The path one node takes, and why."""

    node: str
    op: str
    path: Path
    reason: str


@dataclass
class Lowering:
    """The decisions of :func:`classify`: a path per node (by node name), the buffers left out
    of the plan with the reason, and each node's tensor names (one per result, ``None`` where a
    result is not a tensor)."""

    paths: dict[str, NodePath] = field(default_factory=dict)
    dynamic: dict[str, str] = field(default_factory=dict)
    results: dict[str, list[str | None]] = field(default_factory=dict)

    def demote(self, node: str, reason: str) -> None:
        """Send an ``out`` node down the ``copy`` path from now on (its out variant failed)."""
        old = self.paths[node]
        self.paths[node] = NodePath(old.node, old.op, "copy", reason)


def classify(
    graph: torch.fx.Graph,
    gp: GraphProblem,
    *,
    unplaceable: Unplaceable = "copy",
    pooled: Iterable[str] = (),
    demoted: Mapping[str, str] | None = None,
    inplace: Iterable[str] = (),
    elsewhere: Mapping[str, str] | None = None,
    planned_outputs: bool = False,
    composite_out_as_copy: bool = False,
) -> Lowering:
    """Decide every node's path (see the module docstring) before planning.

    ``pooled`` are buffers whose size follows a growing dimension (dynamic pool); ``demoted``
    maps nodes whose out variant failed before to the reason (they take the ``copy`` path);
    ``inplace`` names the nodes rewritten to run in place (for the report's reason);
    ``elsewhere`` maps tensors on another device than the arena to the reason (they stay out of
    the plan, as the op made them). ``planned_outputs`` plans the graph's outputs like any
    other buffer (they are then views of the arena, :mod:`~tensorarena.runtime.held_arenas`).
    ``composite_out_as_copy`` sends ops whose out variant is ATen's generated wrapper (the op
    run elsewhere, then copied into ``out``) down the copy path, where kernels' allocations
    served from the arena (:mod:`~tensorarena.runtime.kernel_arena`) put the op's own result in
    its slot instead of beside it.
    """
    inplace = set(inplace)
    planned = {b.id for b in gp.problem.buffers}
    spans = {b.id: b.end - b.start for b in gp.problem.buffers}
    outputs = set(gp.outputs)
    pooled = set(pooled)
    demoted = demoted or {}
    elsewhere = elsewhere or {}
    lowering = Lowering()
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        op = _op_label(node)
        value = _meta_value(node)
        if _is_tensor_like(value):
            names: list[str | None] = [node.name]
        elif isinstance(value, (list, tuple)) and node.target is not operator.getitem:
            names = [
                name if _is_tensor_like(v) else None
                for name, v in zip(_element_names(node, len(value)), value, strict=True)
            ]
        else:
            names = []
        lowering.results[node.name] = names
        roots = [name for name in names if name is not None and name in planned]
        if not roots:
            if any(name is not None and name in gp.aliases for name in names):
                reason = "in-place" if _mutates(node) else "view of its input"
                if node.name in inplace:
                    reason = "in-place (rewritten: its input dies here)"
                lowering.paths[node.name] = NodePath(node.name, op, "alias", reason)
            else:
                reason = "picks one result" if node.target is operator.getitem else "no tensor"
                lowering.paths[node.name] = NodePath(node.name, op, "other", reason)
            continue
        for root in roots:
            if root in outputs and not planned_outputs:
                lowering.dynamic[root] = "graph output, handed to the caller"
            elif root in elsewhere:
                lowering.dynamic[root] = elsewhere[root]
            elif root in pooled:
                lowering.dynamic[root] = "size follows a growing dimension"
        variant = out_variant(_call_target(node)) if node.op == "call_function" else None
        differs = variant is not None and out_differs(node)
        if differs:
            variant = None  # not the op's own kernel: the result could differ
        kept = [root for root in roots if root not in lowering.dynamic]
        whole = len(roots) == len(names)  # every result is a fresh planned-or-pooled buffer
        if node.name in demoted and kept:
            path: Path = "copy"
            reason = demoted[node.name]
        elif not kept and any(lowering.dynamic[r].startswith("size") for r in roots):
            path = "pool" if variant is not None and whole else "dynamic"
            reason = "size follows a growing dimension" + (
                "" if path == "pool" else " (no out variant: the op allocates it)"
            )
        elif not kept:
            path, reason = "dynamic", lowering.dynamic[roots[0]]
        elif (variant is not None and whole and len(kept) == len(roots)
              and composite_out_as_copy and _composite_out(node, variant)):
            path = "copy"
            reason = (f"{variant.name} runs the op elsewhere and copies: run, its result "
                      "served in its slot")
        elif variant is not None and whole and len(kept) == len(roots):
            path, reason = "out", f"written in place by {variant.name}"
        elif variant is None and (
            unplaceable == "dynamic"
            or (unplaceable == "auto" and all(spans[r] <= SHORT_LIVED_STEPS for r in kept))
        ):
            path, reason = "dynamic", "no out variant: result kept where the op allocated it"
            if unplaceable == "auto":
                reason = "no out variant, short-lived: kept where the op allocated it"
            for root in kept:
                lowering.dynamic[root] = reason
        else:
            path = "copy"
            reason = (
                "no out variant: run, then copied into its slot"
                if variant is None
                else "results only partly planned: run, then copied into the slots"
            )
            if differs:
                reason = "its out variant is another kernel: run, then copied into its slot"
        lowering.paths[node.name] = NodePath(node.name, op, path, reason)
    return lowering


#: Out variants that are ATen's generated wrappers (``autogen:`` in native_functions.yaml: the
#: functional op run into fresh tensors, then copied into ``out``) of ops whose results are
#: large. Not every out variant without a CPU kernel is one: ``linear.out`` (addmm into out)
#: and ``arange.out`` write in place, so the list is explicit.
COMPOSITE_OUT = frozenset({
    "aten::convolution.out", "aten::convolution_backward.out", "aten::native_layer_norm.out",
    "aten::native_layer_norm_backward.out", "aten::native_batch_norm_backward.out",
    "aten::_native_batch_norm_legit_no_training.out", "aten::native_group_norm.out",
    "aten::native_group_norm_backward.out", "aten::slice_backward.out",
    "aten::select_backward.out",
})


def _composite_out(node: torch.fx.Node, variant: Any) -> bool:
    """Whether ``variant`` is one of :data:`COMPOSITE_OUT` and has no CPU kernel of its own in
    this torch, and ``node`` is written by it as such (not by one of the in-slot rewrites of
    :mod:`~tensorarena.runtime.in_slot`)."""
    import torch

    if variant.name not in COMPOSITE_OUT or (
            embedding_in_slot(node) or written_in_slot(node) is not None or clone_in_slot(node)
            or embedding_backward_in_slot(node) or mean_as_sum(node) is not None):
        return False
    return not torch._C._dispatch_has_kernel_for_dispatch_key(variant.name, "CPU")


def _call_target(node: torch.fx.Node) -> Any:
    """The op the generated code calls for ``node``: a ``.Tensor`` twin where its numbers are
    made once (:func:`~tensorarena.runtime.scalars.hoisted`), else the node's own."""
    rewritten = hoisted(node, lambda value, dtype: object())
    return rewritten[0] if rewritten is not None else node.target


def _op_label(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "name", None)
    if callable(name):  # OpOverload.name() -> "aten::mm"; its str is "aten.mm.default"
        return str(target)
    if node.op == "call_method":
        return f"Tensor.{target}"
    return getattr(target, "__name__", str(target))


def _mutates(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return bool(schema.is_mutable)
    return _op_name(node).endswith("_") and not _op_name(node).endswith("__")


# ----------------------------------------------------------------------------------------------
# Code generation
# ----------------------------------------------------------------------------------------------


@dataclass
class Generated:
    """The generated function and what it needs: ``run(inputs) -> outputs`` (flat lists), its
    source (for debugging), the slot tensors by buffer id, the nodes whose out variant
    failed at run time (filled in by the function itself; the program then re-lowers them),
    and the generated function's globals (``namespace``: what :meth:`release` clears; ``run``
    may be a wrapper defined elsewhere, whose globals are its module's)."""

    run: Callable[[list[Any]], Any]
    source: str
    slots: dict[str, torch.Tensor]
    failed: dict[str, str]
    namespace: dict[str, Any] = field(default_factory=dict)

    def release(self) -> None:
        """Drop the code's references to its memory now: the generated function is in its own
        globals (a cycle only the garbage collector would break), and they hold the slots."""
        self.namespace.clear()
        self.slots.clear()


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

    writer = _Writer()
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
            lines.append(f"    v{i} = {writer.const(_resolve(owner, str(node.target)))}")
        else:
            at = len(lines)
            _statement(writer, node, i, index, lowering, slots, failed, pool_tensor, owner)
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
    exec(compile(source, f"<tensorarena planned {gp.name or 'program'}>", "exec"), namespace)
    run = namespace["run"] if kernel is None else kernel.installed(namespace["run"])
    return Generated(run, source, slots, failed, namespace)


def _arm_around(writer: _Writer, at: int, kernel: KernelHooks, node: str,
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


def _resolve(owner: Any, target: str) -> Any:
    value = owner
    for part in target.split("."):
        value = getattr(value, part)
    return value


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


def _statement(
    writer: _Writer,
    node: torch.fx.Node,
    i: int,
    index: Mapping[torch.fx.Node, int],
    lowering: Lowering,
    slots: Mapping[str, torch.Tensor],
    failed: dict[str, str],
    pool_tensor: Callable[[str], Any] | None,
    owner: Any,
) -> None:
    lines = writer.lines
    target = node.target
    if node.op == "call_module":
        target = _resolve(owner, str(target))
    if target is operator.getitem and len(node.args) == 2 and isinstance(node.args[1], int):
        lines.append(f"    v{i} = {writer.expr(node.args[0], index)}[{node.args[1]}]")
        return
    call_args, call_kwargs = node.args, node.kwargs
    rewritten = hoisted(node, _zero_dim) if node.op == "call_function" else None
    if rewritten is not None:  # classify chose the path for this target (_call_target)
        target, call_args, call_kwargs = rewritten
    args = ", ".join(
        [writer.expr(a, index) for a in call_args]
        + [f"{k}={writer.expr(v, index)}" for k, v in call_kwargs.items()]
    )
    if node.op == "call_method":
        self_arg, *rest = node.args
        rest_args = ", ".join(
            [writer.expr(a, index) for a in rest]
            + [f"{k}={writer.expr(v, index)}" for k, v in node.kwargs.items()]
        )
        call = f"{writer.expr(self_arg, index)}.{target}({rest_args})"
    else:
        call = f"{writer.const(_raw(target))}({args})"
    path = lowering.paths.get(node.name)
    names = lowering.results.get(node.name, [])
    sep = ", " if args else ""
    if path is None or path.path in ("alias", "dynamic", "other"):
        lines.append(f"    v{i} = {call}")
    elif path.path == "out":
        variant = out_variant(target)
        assert variant is not None  # classify chose "out" because there is one
        if variant.dropped:  # tensor options the slot already has
            args = ", ".join(
                [writer.expr(a, index) for a in call_args]
                + [f"{k}={writer.expr(v, index)}" for k, v in call_kwargs.items()
                   if k not in variant.dropped]
            )
            sep = ", " if args else ""
        outs = ", ".join(
            f"{kw}={writer.const(slots[str(name)])}"
            for kw, name in zip(variant.outputs, names, strict=True)
        )
        lines.append("    try:")
        summed = mean_as_sum(node)
        result = slots[str(names[0])] if len(names) == 1 else None
        if embedding_in_slot(node) and result is not None and result.is_contiguous():
            weight, indices = (writer.expr(a, index) for a in call_args[:2])
            rows = writer.const(result.view(-1, result.shape[-1]))
            import torch

            select = writer.const(_raw(torch.ops.aten.index_select.out))
            lines.append(f"        {select}({weight}, 0, {indices}.reshape(-1), out={rows})")
            lines.append(f"        v{i} = {writer.const(result)}")
        elif (written := written_in_slot(node)) is not None and result is not None:
            fill = ""  # "empty": the slot is the result
            if written == "copy":
                fill = f".copy_({writer.expr(call_args[0], index)})"
            elif written == "fill":
                fill = f".fill_({writer.expr(call_args[1], index)})"
            elif written in ("one", "zero"):
                fill = ".fill_(1)" if written == "one" else ".zero_()"
            lines.append(f"        v{i} = {writer.const(result)}{fill}")
        elif clone_in_slot(node) and result is not None:
            source = writer.expr(call_args[0], index)
            lines.append(f"        v{i} = {writer.const(result)}.copy_({source})")
        elif embedding_backward_in_slot(node) and len(names) == 1:
            grad, indices, _, padding_idx, _ = (writer.expr(a, index) for a in call_args)
            into = writer.const(embedding_dense_backward_into)
            lines.append(f"        v{i} = {into}({writer.const(slots[str(names[0])])}, "
                         f"{grad}, {indices}, {padding_idx})")
        elif summed is not None and len(names) == 1:  # mean = sum, then divide by a made count
            count = _zero_dim(summed[1], str(slots[str(names[0])].dtype).removeprefix("torch."))
            lines.append(f"        v{i} = {writer.const(_raw(summed[0]))}({args}{sep}{outs})")
            lines.append(f"        v{i}.div_({writer.const(count)})")
        else:
            lines.append(f"        v{i} = {writer.const(_raw(variant.op))}({args}{sep}{outs})")
        lines.append("    except Exception as error:")
        lines.append(f"        _failed[{node.name!r}] = f'{variant.name} failed: {{error}}'")
        lines.append(f"        v{i} = {_copy_into(writer, call, names, slots)}")
    elif path.path == "copy" and _copies_in_place(node, names, slots):
        # A reshape, contiguous or dtype conversion is a copy: the slot (seen in the input's
        # shape) takes the elements straight from the input, in the order the op reads them.
        slot_name, source = writer.const(slots[str(names[0])]), writer.expr(node.args[0], index)
        lines.append(f"    {slot_name}.view({source}.shape).copy_({source})")
        lines.append(f"    v{i} = {slot_name}")
    elif path.path == "copy":
        if writer.note is not None:  # recording kernels' allocations: keep the results' layout
            call = f"{writer.const(writer.note)}({node.name!r}, {call})"
        lines.append(f"    v{i} = {_copy_into(writer, call, names, slots)}")
    elif path.path == "pool":
        variant = out_variant(target)
        assert variant is not None and pool_tensor is not None
        outs = ", ".join(
            f"{kw}={writer.const(pool_tensor(str(name)))}()"
            for kw, name in zip(variant.outputs, names, strict=True)
        )
        lines.append(f"    v{i} = {writer.const(_raw(variant.op))}({args}{sep}{outs})")


def _copies_in_place(node: torch.fx.Node, names: list[str | None],
                     slots: Mapping[str, torch.Tensor]) -> bool:
    """A ``reshape``, ``contiguous`` or ``to(dtype)`` (ops that copy, or return their input)
    whose planned result is a contiguous slot: copy straight into it."""
    import torch

    aten = torch.ops.aten
    if node.target not in (aten.reshape.default, aten.contiguous.default, aten.to.dtype):
        return False
    if len(names) != 1 or (node.target is aten.to.dtype and (
        len(node.args) > 2 or set(node.kwargs) - {"non_blocking"}
    )):
        return False  # to(dtype, non_blocking, copy, memory_format): only the plain form
    result = slots.get(str(names[0]))
    return result is not None and result.is_contiguous() and isinstance(node.args[0], type(node))


def _zero_dim(value: bool | int | float, dtype: str) -> torch.Tensor:
    import torch

    return torch.tensor(value, dtype=getattr(torch, dtype))


def _copy_into(
    writer: _Writer, call: str, names: list[str | None], slots: Mapping[str, torch.Tensor]
) -> str:
    """An expression: run ``call`` and copy its planned results into their slots."""
    if len(names) == 1 and names[0] is not None and names[0] in slots:
        return f"{writer.const(slots[names[0]])}.copy_({call})"
    parts = []
    for k, name in enumerate(names):
        if name is not None and name in slots:
            parts.append(f"{writer.const(slots[name])}.copy_(_r[{k}])")
        else:
            parts.append(f"_r[{k}]")
    return f"(lambda _r: ({', '.join(parts)},))({call})"


def _raw(target: Any) -> Any:
    """The C++ callable behind an ``OpOverload`` (skips one Python frame per call)."""
    raw = getattr(target, "_op", None)
    return raw if callable(raw) and hasattr(target, "_schema") else target


class _Writer:
    """Source lines plus the globals they name: constants are hoisted, never printed."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.globals: dict[str, Any] = {}
        self._names: dict[int, str] = {}
        #: what the copy path passes an op's results through first (KernelHooks.note)
        self.note: Callable[[str, Any], Any] | None = None

    def const(self, value: Any) -> str:
        key = id(value)
        name = self._names.get(key)
        if name is None:
            name = f"_g{len(self._names)}"
            self._names[key] = name
            self.globals[name] = value
        return name

    def expr(self, value: Any, index: Mapping[Any, int]) -> str:
        import torch.fx

        if isinstance(value, torch.fx.Node):
            return f"v{index[value]}"
        if isinstance(value, tuple):
            items = [self.expr(v, index) for v in value]
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(value, list):
            return f"[{', '.join(self.expr(v, index) for v in value)}]"
        if isinstance(value, dict):
            pairs = ", ".join(f"{k!r}: {self.expr(v, index)}" for k, v in value.items())
            return f"{{{pairs}}}"
        if isinstance(value, slice):
            parts = (self.expr(p, index) for p in (value.start, value.stop, value.step))
            return f"slice({', '.join(parts)})"
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float) and math.isfinite(value):
            return repr(value)
        return self.const(value)
