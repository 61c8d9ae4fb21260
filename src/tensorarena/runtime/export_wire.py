"""An exported program sent from the export's child as the planner needs it, not as torch saves it.

``torch.export.save`` writes the whole program as JSON: every node with all its metadata (stack
traces, module stacks, source functions) and each value's fake tensor. Reading it back
(``torch.export.load``) parses the JSON into dicts, the dicts into torch's schema dataclasses,
and those into the graph: megabytes of short-lived Python objects made in between the graph's
own, which left the interpreter's small-object arenas (pymalloc, 1 MiB each) pinned by a few live
objects apiece: GPT-2 124M kept 7 more arenas resident, and 6 after the program was deleted.

:func:`pack` (in the child) pickles what this process cannot recompute: each node's operation,
name, target (an operator by name) and arguments, each node's value as a spec, the signatures and
the constants that are not the model's own. The values are those :func:`propagate_fakes` gives
(the graph run on fake tensors, from the placeholders' values as :func:`unpack` makes them): it
runs in the child, where the export made torch's per-operator tables already, and not here,
where the few objects it makes once per process (operator registry entries, weakrefs) in the
middle of the build's temporaries kept about ten one-MiB small-object arenas resident after the
program was deleted (Llama 125M). The export's own values are not sent: they differ from a
propagation's (``aten.dropout`` in eval mode gives a new storage there, an alias of its input
here and in eager; a CPU attention's strides), and the planner reads aliasing from them.

A value's spec keeps its structure (a tuple, list or dict of leaves) and gives each tensor its
shape, strides, storage offset, dtype, device, ``requires_grad`` and a storage key: the distinct
storages numbered in the order the nodes first show them (placeholders' included), each with its
size. :func:`unpack` makes the graph node by node as it reads them, gives each placeholder its
fake value (the model's own tensors for parameters and buffers: tied weights share one), each
storage first seen at a placeholder that placeholder's fake storage and every other one fresh
``meta`` bytes, and each tensor a fake view of its storage (``set_`` on a ``meta`` tensor, so
that one storage read under two dtypes stays one): no operator runs through the fake mode.
Node metadata other than the values is not sent: the planner reads only ``val``.

The program's module is made lazy (FX's ``_LazyGraphModule``): ``ExportedProgram`` otherwise
writes and compiles the whole graph's ``forward``, which the planner never runs, while it reads
the program back: the build's peak, and interpreter arenas kept resident by what it left
(``bench/build_peaks.py``). Its code is written the first time something runs it or reads it.

Only programs with static shapes and no subgraphs travel so (no range constraints, only
placeholders, operator calls and the output, every placeholder a tensor with a static shape or a
plain constant, every value one a spec carries): :func:`pack` gives ``None`` for the others,
which travel with torch's format.
"""

from __future__ import annotations

import io
import operator
import pickle
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["lazy_graph_modules", "pack", "propagate_fakes", "unpack"]

_NODE, _OP, _LEAF = "n", "o", "l"
_PLAIN = (int, float, bool, str, type(None))
#: A value's spec: a tensor, a plain leaf, or a tuple, list or dict of specs.
_TENSOR, _VALUE, _TUPLE, _LIST, _DICT = "t", "v", "(", "[", "{"
_ABSENT = object()  # a node without a value (an operator that returns None)


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
        values = _fake_values(th, ep, [row[3] for row in rows if row[0] == "placeholder"])
        storages: dict[int, int] = {}  # a storage's ``_cdata`` -> its key
        sizes: list[int] = []
        rows = [(*row, _spec(th, value, storages, sizes))
                for row, value in zip(rows, values, strict=True)]
    except _NotSent:
        return None
    except Exception:  # an operator the fake mode cannot run: torch's format, as before
        return None
    state = {k: v for k, v in ep.state_dict.items() if own.get(k) is not v}
    constants = {k: v for k, v in ep.constants.items() if own.get(k) is not v}
    head = {"rows": len(rows), "signature": ep.graph_signature,
            "calls": ep.module_call_graph, "verifiers": list(ep.verifiers),
            "guards": list(getattr(ep, "_guards_code", []))}
    tail = {"state_dict": state, "constants": constants,
            "state_order": list(ep.state_dict), "constant_order": list(ep.constants),
            "example_inputs": _shapes_only(th, ep.example_inputs), "storage_sizes": sizes}
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


def _fake_values(th: Any, ep: torch.export.ExportedProgram, specs: list[Any]) -> list[Any]:
    """Each node's value as :func:`unpack` would give it by :func:`propagate_fakes`, with the
    placeholders' values made as it makes them; the graph's own values are left as they were."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    placeholders = _placeholder_values(th, mode, ep.graph, specs,
                                       {**ep.state_dict, **ep.constants},
                                       ep.graph_signature)
    nodes = list(ep.graph.nodes)
    kept = [node.meta.pop("val", _ABSENT) for node in nodes]
    try:
        propagate_fakes(ep.graph, placeholders, mode)
        return [node.meta.pop("val", _ABSENT) for node in nodes]
    finally:
        for node, value in zip(nodes, kept, strict=True):
            node.meta.pop("val", None)
            if value is not _ABSENT:
                node.meta["val"] = value


def _spec(th: Any, value: Any, storages: dict[int, int], sizes: list[int]) -> Any:
    """``value`` as plain data: its structure, each tensor's layout and storage key (``sizes``
    gets each new storage's size)."""
    if value is _ABSENT:
        return None
    if isinstance(value, th.Tensor):
        shape, stride = tuple(value.shape), tuple(value.stride())
        offset = value.storage_offset()
        if not all(type(n) is int for n in (*shape, *stride, offset)):  # symbolic
            raise _NotSent(value)
        storage = value.untyped_storage()
        key = storages.setdefault(storage._cdata, len(storages))
        if key == len(sizes):
            sizes.append(storage.nbytes())
        return (_TENSOR, shape, stride, offset, value.dtype, value.device,
                value.requires_grad, key)
    if type(value) in (int, float, bool, type(None)):
        return (_VALUE, value)
    if type(value) is tuple or isinstance(value, list):  # a namedtuple is left to torch's
        kind = _TUPLE if type(value) is tuple else _LIST
        return (kind, [_spec(th, v, storages, sizes) for v in value])
    if isinstance(value, dict):
        return (_DICT, [(k, _spec(th, v, storages, sizes)) for k, v in value.items()])
    raise _NotSent(value)


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
    inputs: list[tuple[Any, ...]] = []  # each placeholder's spec as one
    specs: list[Any] = []  # each node's value's
    for _ in range(head["rows"]):
        op, name, target, args, kwargs, value = reader.load()
        if op == "placeholder":
            inputs.append(args)
            args = ()
        specs.append(value)
        node = graph.create_node(op, target, args, kwargs, name=name)
        if node.name != name:  # FX renames a builtin's name ("input"); export's names stand
            node.name = name
        nodes.append(node)
    tail = reader.load()
    state = _with_own(tail["state_order"], tail["state_dict"], own)
    constants = _with_own(tail["constant_order"], tail["constants"], own)
    values = _placeholder_values(th, mode, graph, inputs, {**state, **constants},
                                 head["signature"])
    _give_values(th, mode, graph, values, specs, tail["storage_sizes"])
    with lazy_graph_modules(th):
        ep = th.export.ExportedProgram(
            root=th.nn.Module(), graph=graph, graph_signature=head["signature"],
            state_dict=state, range_constraints={}, module_call_graph=head["calls"],
            example_inputs=tail["example_inputs"], constants=constants,
            verifiers=head["verifiers"])
    ep._guards_code = head["guards"]
    return ep  # type: ignore[no-any-return]


_LAZY_LOCK = threading.RLock()  # re-entered: an inner one puts back the outer's factory


@contextmanager
def lazy_graph_modules(th: Any) -> Iterator[None]:
    """Within it, the module an ``ExportedProgram`` makes for its graph is FX's lazy one (module
    docstring); where this torch has no such module, nothing changes. Another thread making an
    ``ExportedProgram`` meanwhile gets a lazy module too, which runs the same."""
    from torch.fx import _lazy_graph_module

    exported = th.export.exported_program
    make = getattr(exported, "_create_graph_module_for_export", None)
    lazy = getattr(_lazy_graph_module, "_LazyGraphModule", None)
    if make is None or lazy is None:
        yield
        return
    with _LAZY_LOCK:
        exported._create_graph_module_for_export = lambda root, graph: lazy(root, graph)
        try:
            yield
        finally:
            exported._create_graph_module_for_export = make


def _placeholder_values(th: Any, mode: Any, graph: torch.fx.Graph, specs: list[Any],
                        tensors: dict[str, Any], signature: Any) -> list[Any]:
    """The placeholders' fake values from their ``specs`` (:func:`_placeholder_spec`): the
    model's own tensors (``tensors`` by the signature's names) made fake, inputs as their shape."""
    from torch._subclasses.fake_tensor import FakeTensor

    targets = {spec.arg.name: spec.target for spec in signature.input_specs
               if getattr(spec.arg, "name", None) is not None and spec.target is not None}
    values = []
    for node, spec in zip(graph.find_nodes(op="placeholder"), specs, strict=True):
        real = tensors.get(targets.get(node.name, ""))
        if isinstance(real, th.Tensor):
            values.append(mode.from_tensor(real, static_shapes=True))
        elif spec[0] == "tensor":
            _, shape, stride, dtype, device, grad = spec
            meta = th.empty_strided(shape, stride, dtype=dtype, device="meta")
            values.append(FakeTensor(mode, meta, device, requires_grad=grad))
        else:
            values.append(spec[1])
    return values


def _give_values(th: Any, mode: Any, graph: torch.fx.Graph, values: list[Any],
                 specs: list[Any], sizes: list[int]) -> None:
    """Each node's ``meta["val"]``: the placeholders' ``values``, the others' made from their
    ``specs`` (one for each node), a storage first seen at a placeholder being its value's."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    storages: dict[int, Any] = {}
    placeholders = iter(values)

    def make(spec: Any) -> Any:
        kind = spec[0]
        if kind == _TENSOR:
            _, shape, stride, offset, dtype, device, grad, key = spec
            storage = storages.get(key)
            if storage is None:
                storage = th.empty((sizes[key],), dtype=th.uint8, device="meta").untyped_storage()
                storages[key] = storage
            meta = th.empty((0,), dtype=dtype, device="meta").set_(storage, offset, shape, stride)
            return FakeTensor(mode, meta, device, requires_grad=grad)
        if kind == _VALUE:
            return spec[1]
        if kind == _DICT:
            return immutable_dict((k, make(v)) for k, v in spec[1])
        items = [make(v) for v in spec[1]]
        return tuple(items) if kind == _TUPLE else immutable_list(items)

    for node, spec in zip(graph.nodes, specs, strict=True):
        if node.op == "placeholder":
            value = next(placeholders)
            if spec is not None and spec[0] == _TENSOR:
                storages.setdefault(spec[-1], value.untyped_storage())
            node.meta["val"] = value
        elif spec is not None:
            node.meta["val"] = make(spec)


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
