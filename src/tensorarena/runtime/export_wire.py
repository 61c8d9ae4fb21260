"""An exported program sent from the export's child as the planner needs it, not as torch saves it.

``torch.export.save`` writes the whole program as JSON: every node with all its metadata (stack
traces, module stacks, source functions) and each value's fake tensor. Reading it back
(``torch.export.load``) parses the JSON into dicts, the dicts into torch's schema dataclasses,
and those into the graph: megabytes of short-lived Python objects made in between the graph's
own, which left the interpreter's small-object arenas (pymalloc, 1 MiB each) pinned by a few live
objects apiece: GPT-2 124M kept 7 more arenas resident, and 6 after the program was deleted.

:func:`pack` (in the child) pickles what this process cannot recompute: each node's operation,
name, target (an operator by name) and arguments, the placeholders' shapes, the signatures and the
constants that are not the model's own. :func:`unpack` makes the graph node by node as it reads
them, gives each placeholder its fake value (the model's own tensors for parameters and buffers:
tied weights share one) and runs the graph on fake tensors (:func:`propagate_fakes`), which
gives every node its value and each view its base's storage as an export made here has them.
Node metadata other than the values is not sent: the planner reads only ``val``.

Only programs with static shapes and no subgraphs travel so (no range constraints, only
placeholders, operator calls and the output, every placeholder a tensor with a static shape or a
plain constant): :func:`pack` gives ``None`` for the others, which travel with torch's format.
"""

from __future__ import annotations

import io
import operator
import pickle
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["pack", "propagate_fakes", "unpack"]

_NODE, _OP, _LEAF = "n", "o", "l"
_PLAIN = (int, float, bool, str, type(None))


class _NotSent(Exception):
    """The program holds something this format does not carry."""


def pack(ep: torch.export.ExportedProgram, own: dict[str, Any]) -> bytes | None:
    """``ep`` in this format, with the entries of its state dict and constants that are
    ``own``'s tensors (by name) left out, or ``None`` where the format cannot carry it."""
    th = load_torch()
    if ep.range_constraints:
        return None
    nodes = list(ep.graph.nodes)
    try:
        rows = [_row(th, node) for node in nodes]
    except _NotSent:
        return None
    state = {k: v for k, v in ep.state_dict.items() if own.get(k) is not v}
    constants = {k: v for k, v in ep.constants.items() if own.get(k) is not v}
    head = {"rows": len(rows), "signature": ep.graph_signature,
            "calls": ep.module_call_graph, "verifiers": list(ep.verifiers),
            "guards": list(getattr(ep, "_guards_code", []))}
    tail = {"state_dict": state, "constants": constants,
            "state_order": list(ep.state_dict), "constant_order": list(ep.constants),
            "example_inputs": _shapes_only(th, ep.example_inputs)}
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, {node: k for k, node in enumerate(nodes)})
    try:
        pickler.dump(head)
        for row in rows:
            pickler.dump(row)
        pickler.dump(tail)
    except Exception:  # something pickle cannot write (a custom class): torch's format
        return None
    return buffer.getvalue()


def _row(th: Any, node: torch.fx.Node) -> tuple[Any, ...]:
    if node.op == "placeholder":
        return (node.op, node.name, node.target, _placeholder_spec(th, node.meta.get("val")), {})
    if node.op == "output":
        return (node.op, node.name, node.target, node.args, node.kwargs)
    if node.op != "call_function":
        raise _NotSent(node.op)
    target = node.target
    if not (isinstance(target, th._ops.OpOverload)
            or getattr(operator, getattr(target, "__name__", ""), None) is target):
        raise _NotSent(target)
    return (node.op, node.name, target, node.args, node.kwargs)


def _placeholder_spec(th: Any, value: Any) -> tuple[Any, ...]:
    if isinstance(value, _PLAIN):
        return ("value", value)
    if not isinstance(value, th.Tensor) or value.storage_offset() != 0:
        raise _NotSent(value)
    shape, stride = tuple(value.shape), tuple(value.stride())
    if not all(type(n) is int for n in shape + stride):  # symbolic
        raise _NotSent(value)
    return ("tensor", shape, stride, value.dtype, value.device, value.requires_grad)


def _shapes_only(th: Any, inputs: Any) -> Any:
    """The example inputs with each tensor a ``meta`` tensor of its shape (``ep.module()``
    reads their structure, not their values)."""
    if inputs is None:
        return None
    from torch.utils import _pytree as pytree

    return pytree.tree_map_only(th.Tensor, lambda t: th.empty_like(t, device="meta"), inputs)


class _Pickler(pickle.Pickler):
    """Nodes as their index, operators by name."""

    def __init__(self, file: io.BytesIO, index: dict[Any, int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._index = index
        self._op_type = load_torch()._ops.OpOverload
        self._node_type = load_torch().fx.Node
        from torch.utils import _pytree as pytree

        self._spec_type = pytree.TreeSpec

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, self._op_type):
            return (_OP, obj.namespace, obj._opname, obj._overloadname)
        if isinstance(obj, self._node_type):
            return (_NODE, self._index[obj])
        if isinstance(obj, self._spec_type) and obj.is_leaf():
            return (_LEAF,)  # torch's one leaf spec: a LeafSpec made anew warns
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, nodes: list[Any]) -> None:
        super().__init__(file)
        self._nodes = nodes

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == _NODE:
            return self._nodes[pid[1]]
        if pid[0] == _LEAF:
            from torch.utils import _pytree as pytree

            return pytree.treespec_leaf()
        _, namespace, name, overload = pid
        return getattr(getattr(getattr(load_torch().ops, namespace), name), overload)


def unpack(data: bytes, own: dict[str, Any]) -> torch.export.ExportedProgram:
    """The program :func:`pack` wrote, with ``own``'s tensors where it left them out."""
    th = load_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Static shapes only (pack's rule): the fake values need no ShapeEnv.
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    graph = th.fx.Graph()
    nodes: list[torch.fx.Node] = []
    reader = _Unpickler(io.BytesIO(data), nodes)
    head = reader.load()
    specs: list[tuple[Any, ...]] = []
    for _ in range(head["rows"]):
        op, name, target, args, kwargs = reader.load()
        if op == "placeholder":
            specs.append(args)
            args = ()
        node = graph.create_node(op, target, args, kwargs, name=name)
        if node.name != name:  # FX renames a builtin's name ("input"); export's names stand
            node.name = name
        nodes.append(node)
    tail = reader.load()
    state = _with_own(tail["state_order"], tail["state_dict"], own)
    constants = _with_own(tail["constant_order"], tail["constants"], own)
    tensors = {**state, **constants}
    targets = {spec.arg.name: spec.target for spec in head["signature"].input_specs
               if getattr(spec.arg, "name", None) is not None and spec.target is not None}
    values = []
    with mode:
        for node, spec in zip(graph.find_nodes(op="placeholder"), specs, strict=True):
            real = tensors.get(targets.get(node.name, ""))
            if isinstance(real, th.Tensor):
                values.append(mode.from_tensor(real, static_shapes=True))
            elif spec[0] == "tensor":
                _, shape, stride, dtype, device, grad = spec
                values.append(th.empty_strided(shape, stride, dtype=dtype, device=device,
                                               requires_grad=grad))
            else:
                values.append(spec[1])
    propagate_fakes(graph, values, mode)
    ep = th.export.ExportedProgram(
        root=th.nn.Module(), graph=graph, graph_signature=head["signature"],
        state_dict=state, range_constraints={}, module_call_graph=head["calls"],
        example_inputs=tail["example_inputs"], constants=constants,
        verifiers=head["verifiers"])
    ep._guards_code = head["guards"]
    return ep  # type: ignore[no-any-return]


def _with_own(order: list[str], sent: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The table in its order: what was sent, and ``own``'s tensors for what was not."""
    return {name: sent[name] if name in sent else own[name] for name in order}


def propagate_fakes(graph: torch.fx.Graph, values: list[Any], mode: Any) -> None:
    """Run ``graph`` on fake tensors from its placeholders' ``values``, in ``mode``: each
    node's ``meta["val"]``, views sharing their base's fake storage. Node by node as
    ``FakeTensorProp.propagate`` runs them, without the fx interpreter's progress bar: its
    tqdm starts a monitor thread, after which no export here could fork."""
    th = load_torch()
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    holder = th.nn.Module()
    holder.graph = graph  # what the interpreter reads of its module
    propagation = FakeTensorProp(holder, mode)
    propagation.env = {}
    propagation.args_iter = iter(values)
    with mode:
        for node in graph.nodes:
            propagation.env[node] = propagation.run_node(node)
    for node, value in zip(graph.find_nodes(op="placeholder"), values, strict=False):
        node.meta["val"] = value
