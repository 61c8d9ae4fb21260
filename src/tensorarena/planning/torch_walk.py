"""A PyTorch graph walked into a planning problem (:mod:`~tensorarena.planning.torch_frontend`).

One buffer per tensor a node creates in fresh storage, sized from its shape, strides and dtype (the
storage extent, so a padded or strided output counts every byte it spans). Views and in-place
results are not new buffers: they alias their base and keep its root alive as long as they are
used. Parameters, module buffers, constants and user inputs are left out of the plan and reported
with their sizes (the front end says which is which). Time is the node index in ``graph.nodes``;
see :mod:`~tensorarena.planning.graph_problem`.

How aliasing is decided, first rule that applies:

1. **ATen's own rules**, where fake tensors disagree with real kernels: an inactive dropout
   (eval mode, or ``p=0``) returns its input itself.
2. **Storage identity.** ``torch.export`` and ``make_fx`` leave a (fake) tensor in
   ``node.meta["val"]``, and views share their base's storage object, so a tensor whose storage
   was seen before is an alias of that storage's root. This also tells a ``reshape`` that copies
   (of a transposed input) from one that views, which an op's schema cannot.
3. **Op schema**, with only ``node.meta["tensor_meta"]`` (from ``ShapeProp``): a return annotated
   ``Tensor(a)`` or ``Tensor(a!)`` aliases the argument annotated with the same set ``a`` (views,
   ``split``'s ``Tensor(a -> *)``, in-place ``add_``, ``out=`` variants). ``reshape``-like ops
   that view only contiguous inputs are checked against the input's strides. Methods and
   ``torch.*`` functions of a symbolically traced graph are looked up by name among the aten ops.

Known limits: an op's temporaries inside its kernel (attention workspaces, say) are not in the
graph and so not planned; nor are the insides of higher-order ops' subgraphs (their inputs and
outputs are). Where a real kernel returns other strides than its fake one (CPU attention returns
a transposed layout), a following ``contiguous`` may copy in the plan but not at run time: the
plan then holds a buffer it did not need, which is wasteful but never unsafe. The tests run real
models and compare every claimed alias and size with the storages the kernels used.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidProblemError
from tensorarena.planning.graph_problem import GraphProblem, Liveness
from tensorarena.planning.torch_graph import (
    MISSING,
    VIEW_IF_CONTIGUOUS,
    Bindings,
    flat_nodes,
    is_contiguous,
    is_tensor_like,
    meta_value,
    op_name,
    remember_storage,
    returns_nothing,
    schema_alias_arg,
    storage_key,
    storages_comparable,
    tensor_nbytes,
    tensor_spec,
)

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["METADATA_ONLY_OPS", "element_names", "walk_graph"]

# Ops that return their input itself when inactive (``train=False`` or ``p=0``).
_DROPOUTS = frozenset({"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"})
# Ops that read only a tensor's metadata: using a tensor this way does not keep its bytes alive.
METADATA_ONLY_OPS = frozenset(
    {"_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}
)


def walk_graph(
    graph: torch.fx.Graph,
    kind_of: Callable[[torch.fx.Node], str],
    attr_of: Callable[[torch.fx.Node], tuple[Any, str] | None],
    *,
    tied: Mapping[str, str] | None = None,
    alignment: int,
    name: str,
    bindings: Bindings | None = None,
) -> GraphProblem:
    """The problem of ``graph``: ``kind_of`` names a placeholder's kind (``"parameter"``,
    ``"buffer"``, ``"constant"``, ``"input"``), ``attr_of`` a ``get_attr`` node's tensor and kind
    (``None``: a constant); ``tied`` maps a placeholder to the one whose tensor it shares."""
    torch = load_torch()
    nodes = list(graph.nodes)
    steps = len(nodes)
    live = Liveness()
    # Storage identity -> the tensor name that owns it; None when the storages of different
    # nodes cannot be compared (make_fx in real mode fakes every value in its own fake mode).
    by_storage: dict[int, str] | None = {} if storages_comparable(nodes) else None
    elements: dict[str, list[str | None]] = {}  # multi-output node -> tensor name per output
    for step, node in enumerate(nodes):
        if node.op == "output":
            outs = [n for n in flat_nodes(node.args) if isinstance(n, torch.fx.Node)]
            live.output((t for n in outs for t in _names(n, live, elements)), steps)
            continue
        if node.op == "placeholder":
            value = meta_value(node)
            if tied and node.name in tied and tied[node.name] in live:
                live.alias(node.name, tied[node.name], step)
            elif is_tensor_like(value):
                live.external(node.name, tensor_nbytes(value, node.name, bindings), kind_of(node))
                remember_storage(value, node.name, by_storage)
            continue
        if node.op == "get_attr":
            attr = attr_of(node)
            value = node.meta.get("val", attr[0] if attr else None)
            if is_tensor_like(value):
                nbytes = tensor_nbytes(value, node.name, bindings)
                live.external(node.name, nbytes, attr[1] if attr else "constant")
                remember_storage(value, node.name, by_storage)
            continue
        selector = _selected_output(node, elements)
        metadata_only = op_name(node) in METADATA_ONLY_OPS
        for arg in () if metadata_only else node.all_input_nodes:
            if selector is None or arg is not node.args[0]:  # picking an output is no use
                for tensor in _names(arg, live, elements):
                    live.use(tensor, step)
        if selector is not None:
            picked = elements[selector[0]][selector[1]]
            if picked is not None and picked != node.name:
                live.alias(node.name, picked, step)
            continue
        value = meta_value(node)
        if value is MISSING:
            if returns_nothing(node):
                continue
            raise InvalidProblemError(
                f"node {node.name!r} ({node.target}) has no shape metadata: trace with "
                "torch.export or make_fx, or run torch.fx.passes.shape_prop.ShapeProp first",
                column=node.name,
            )
        if is_tensor_like(value):
            _place(node, 0, node.name, value, step, live, by_storage, elements, bindings)
        elif isinstance(value, (list, tuple)):
            names = element_names(node, len(value))
            elements[node.name] = [
                n if is_tensor_like(v) else None for n, v in zip(names, value, strict=True)
            ]
            for k, (tensor, v) in enumerate(zip(names, value, strict=True)):
                if is_tensor_like(v):
                    _place(node, k, tensor, v, step, live, by_storage, elements, bindings)
    return live.build(steps=steps, name=name, alignment=alignment)


def _place(
    node: torch.fx.Node,
    k: int,
    tensor: str,
    value: Any,
    step: int,
    live: Liveness,
    by_storage: dict[int, str] | None,
    elements: dict[str, list[str | None]],
    bindings: Bindings | None,
) -> None:
    """Record output ``k`` of ``node`` (named ``tensor``): an alias of a known root, or new."""
    key = storage_key(value) if by_storage is not None else None
    base = _identity_base(node, live, elements)
    if base is None and _writes_in_place(node, k):
        # An in-place or out= op returns the argument it wrote, whatever the fake storages
        # say (a graph rewritten to run in place keeps its functional fake values).
        base = _schema_alias_base(node, k, live, elements)
    if base is not None:
        pass
    elif by_storage is not None and key is not None:
        base = by_storage.get(key)
    else:
        base = _schema_alias_base(node, k, live, elements)
    if base is not None:
        live.alias(tensor, base, step)
        # A fake storage that stands for the base's bytes (an inactive dropout's) leads there too.
        remember_storage(value, base, by_storage)
    else:
        spec = tensor_spec(value, tensor, bindings)
        live.produce(tensor, step, spec.nbytes, spec)
        remember_storage(value, tensor, by_storage)


def _writes_in_place(node: torch.fx.Node, k: int) -> bool:
    """True if result ``k`` of ``node``'s op schema is an argument it writes (``Tensor(a!)``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or k >= len(schema.returns):
        return False
    info = schema.returns[k].alias_info
    return info is not None and bool(info.is_write)


def _identity_base(
    node: torch.fx.Node, live: Liveness, elements: dict[str, list[str | None]]
) -> str | None:
    """The input that an inactive dropout returns as is (ATen returns ``input`` itself when
    ``train`` is false or ``p`` is 0, though fake tensors show a fresh storage)."""
    if op_name(node) not in _DROPOUTS or not node.args:
        return None
    p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
    if train is not False and p != 0:
        return None
    source = node.args[0]
    names = _names(source, live, elements) if isinstance(source, type(node)) else []
    return names[0] if len(names) == 1 else None


def _names(node: torch.fx.Node, live: Liveness, elements: dict[str, list[str | None]]) -> list[str]:
    """The tensor names a node's value stands for (none, one, or one per output)."""
    if node.name in live:
        return [node.name]
    return [t for t in elements.get(node.name, ()) if t is not None]


def _selected_output(
    node: torch.fx.Node, elements: dict[str, list[str | None]]
) -> tuple[str, int] | None:
    """``(parent, index)`` if ``node`` is ``getitem`` picking one output of a multi-output node."""
    if node.target is not operator.getitem or not node.args:
        return None
    parent, index = node.args[0], node.args[1] if len(node.args) > 1 else None
    name = getattr(parent, "name", None)
    if (
        name in elements
        and isinstance(index, int)
        and -len(elements[name]) <= index < len(elements[name])
    ):
        return name, index % len(elements[name])
    return None


def element_names(node: torch.fx.Node, count: int) -> list[str]:
    """Output ``k`` is named after the first ``getitem`` user that picks it, else ``node.k``."""
    names = [f"{node.name}.{k}" for k in range(count)]
    named: set[int] = set()
    for user in node.users:
        if user.target is operator.getitem and len(user.args) > 1:
            index = user.args[1]
            if isinstance(index, int) and -count <= index < count and index % count not in named:
                names[index % count] = user.name
                named.add(index % count)
    return names


def _schema_alias_base(
    node: torch.fx.Node, k: int, live: Liveness, elements: dict[str, list[str | None]]
) -> str | None:
    """The tensor that output ``k`` of ``node`` aliases according to its schema, if any."""
    base = schema_alias_arg(node, k)
    if base is None or not hasattr(base, "name"):
        return None
    if op_name(node) in VIEW_IF_CONTIGUOUS:
        value = meta_value(base)
        if not is_tensor_like(value) or not is_contiguous(value):
            return None  # a reshape of a non-contiguous tensor copies
    names = _names(base, live, elements)
    return names[0] if len(names) == 1 else None
