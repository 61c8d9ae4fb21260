"""Tensor metadata and op schemas of ``torch.fx`` nodes: the toolkit of planning and runtime.

The questions the torch front end's graph walk (:mod:`~tensorarena.planning.torch_walk`) asks of
each node: how many bytes does its value span, which storage is it in, and, where the metadata
has no storages, which argument does the op's schema say it aliases. The runtime asks the same of
the graphs it runs (a node's value, its layout, the size symbols it depends on). torch is never
imported at module level.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidProblemError
from tensorarena.planning.graph_problem import TensorSpec

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = [
    "MISSING",
    "VIEW_IF_CONTIGUOUS",
    "Bindings",
    "evaluate",
    "flat_nodes",
    "free_symbols",
    "is_contiguous",
    "is_tensor_like",
    "meta_value",
    "op_name",
    "remember_storage",
    "returns_nothing",
    "schema_alias_arg",
    "storage_key",
    "storages_comparable",
    "tensor_nbytes",
    "tensor_spec",
]

#: Ops whose schema says "alias" but which copy when the input is not contiguous.
VIEW_IF_CONTIGUOUS = frozenset({"reshape", "flatten", "contiguous", "reshape_as"})
# Ops that reuse their input's storage without saying so in their schema.
_UNANNOTATED_ALIASES = frozenset({"_unsafe_view"})


# ----------------------------------------------------------------------------------------------
# Tensor metadata: sizes and storages
# ----------------------------------------------------------------------------------------------

#: What :func:`meta_value` returns for a node without a recorded value.
MISSING = object()


def meta_value(node: torch.fx.Node) -> Any:
    """The node's recorded value: a fake tensor (export, make_fx, dynamo), ShapeProp's
    ``TensorMetadata``, or :data:`MISSING`."""
    for key in ("val", "example_value"):  # export/make_fx, dynamo
        if key in node.meta:
            return node.meta[key]
    if "tensor_meta" in node.meta:
        return node.meta["tensor_meta"]
    return MISSING


def is_tensor_like(value: Any) -> bool:
    """Whether a recorded value is a tensor (fake or real) or ShapeProp's metadata of one."""
    torch = load_torch()
    from torch.fx.passes.shape_prop import TensorMetadata

    return isinstance(value, (torch.Tensor, TensorMetadata))


def storage_key(value: Any) -> int | None:
    """An id of the tensor's storage, equal for tensors that share one; None if it has none."""
    torch = load_torch()
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return int(value.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None  # sparse, nested and other storage-less tensors


def storages_comparable(nodes: list[torch.fx.Node]) -> bool:
    """True if all fake values come from one fake mode, so equal storages mean shared bytes."""
    from torch.utils import _pytree as pytree

    modes = set()
    for node in nodes:
        for value in pytree.tree_leaves(meta_value(node)):
            mode = getattr(value, "fake_mode", None)
            if mode is not None:
                modes.add(id(mode))
                if len(modes) > 1:
                    return False
    return True


def remember_storage(value: Any, tensor: str, by_storage: dict[int, str] | None) -> None:
    """Record ``tensor`` as the first owner of its value's storage in ``by_storage``."""
    key = storage_key(value) if by_storage is not None else None
    if by_storage is not None and key is not None:
        by_storage.setdefault(key, tensor)


#: Concrete values for the size symbols of a dynamic-shape graph (``s0`` → 16), by symbol.
Bindings = Mapping[Any, int]


def tensor_spec(value: Any, tensor: str, bindings: Bindings | None = None) -> TensorSpec:
    """The concrete layout of a tensor value (fake tensor or ShapeProp's ``TensorMetadata``);
    symbolic sizes are evaluated with ``bindings``."""
    torch = load_torch()
    if isinstance(value, torch.Tensor):
        shape, stride, offset = value.shape, value.stride(), value.storage_offset()
    else:  # ShapeProp's TensorMetadata has no storage offset: the tensor starts its storage
        shape, stride, offset = value.shape, value.stride, 0
    return TensorSpec(
        shape=tuple(_concrete(s, tensor, bindings) for s in shape),
        stride=tuple(_concrete(s, tensor, bindings) for s in stride),
        dtype=str(value.dtype).removeprefix("torch."),
        itemsize=int(value.dtype.itemsize),
        storage_offset=_concrete(offset, tensor, bindings),
    )


def tensor_nbytes(value: Any, tensor: str, bindings: Bindings | None = None) -> int:
    """Bytes of storage the tensor spans: ``(offset + 1 + Σ (size - 1) × stride) × itemsize``."""
    return tensor_spec(value, tensor, bindings).nbytes


def _concrete(value: Any, tensor: str, bindings: Bindings | None = None) -> int:
    if isinstance(value, int):
        return value
    node = getattr(value, "node", None)
    as_int = getattr(node, "maybe_as_int", lambda: None)()
    if isinstance(as_int, int):
        return as_int
    expr = getattr(node, "expr", None)
    if bindings and expr is not None:
        bound = evaluate(expr, bindings)
        if bound is not None:
            return bound
    raise InvalidProblemError(
        f"tensor {tensor!r} has a symbolic size ({value}); a static plan needs concrete "
        "shapes: export with static shapes, trace with concrete example inputs, or bind the "
        "symbols (tensorarena.runtime plans a dynamic-shape program per shape)",
        column=tensor,
    )


def evaluate(expr: Any, bindings: Bindings) -> int | None:
    """A sympy size expression's value with ``bindings``, or None if a symbol is unbound."""
    bound = expr.xreplace(bindings)  # a bare symbol is replaced by the int itself
    if isinstance(bound, int):
        return bound
    return int(bound) if bound.is_number else None


def free_symbols(value: Any) -> frozenset[Any]:
    """The size symbols a tensor value's shape, strides or offset depend on (none if static)."""
    torch = load_torch()
    if not isinstance(value, torch.Tensor):
        return frozenset()
    symbols: set[Any] = set()
    for size in (*value.shape, *value.stride(), value.storage_offset()):
        expr = getattr(getattr(size, "node", None), "expr", None)
        if expr is not None:
            symbols |= expr.free_symbols
    return frozenset(symbols)


def is_contiguous(value: Any) -> bool:
    """Whether a tensor value (or its ShapeProp metadata) is laid out contiguously."""
    torch = load_torch()
    if isinstance(value, torch.Tensor):
        return bool(value.is_contiguous())
    expected = 1
    for size, stride in reversed(list(zip(value.shape, value.stride, strict=True))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


# ----------------------------------------------------------------------------------------------
# Aliasing from op schemas (used when the metadata has no storages)
# ----------------------------------------------------------------------------------------------


def op_name(node: torch.fx.Node) -> str:
    """The op's base name: ``reshape`` for ``aten.reshape.default``, a method or a function."""
    if node.op == "call_method":
        return str(node.target)
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


def _schemas(node: torch.fx.Node) -> list[Any]:
    """The aten schemas that may describe ``node``: its own, or those of the aten op of the same
    name for ``call_method`` nodes and ``torch.*`` functions."""
    torch = load_torch()
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return [schema]
    op_name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    if not isinstance(op_name, str) or node.op not in ("call_method", "call_function"):
        return []
    packet = getattr(torch.ops.aten, op_name, None)
    if packet is None:
        return []
    try:
        return [getattr(packet, overload)._schema for overload in packet.overloads()]
    except (AttributeError, RuntimeError):
        return []


def schema_alias_arg(node: torch.fx.Node, k: int) -> Any:
    """The argument the node's ``k``-th result aliases by its schema (or by indexing), or None."""
    torch = load_torch()
    if node.target is operator.getitem:  # tensor indexing: basic indices view, tensors copy
        index = node.args[1] if len(node.args) > 1 else None
        indices = index if isinstance(index, tuple) else (index,)
        basic = all(
            i is None or i is Ellipsis or isinstance(i, (int, slice))
            for i in indices
            if not isinstance(i, torch.fx.Node)
        ) and not any(isinstance(i, torch.fx.Node) for i in indices)
        return node.args[0] if basic else None
    if op_name(node) in _UNANNOTATED_ALIASES and node.args:
        return node.args[0]
    for schema in _schemas(node):
        returns = schema.returns
        if k < len(returns):
            ret = returns[k]
        elif len(returns) == 1 and str(returns[0].type).startswith("List["):
            ret = returns[0]  # a list return: every element shares the annotation
        else:
            continue
        if ret.alias_info is None:
            continue
        sets = set(ret.alias_info.before_set)
        for i, arg in enumerate(schema.arguments):
            info = arg.alias_info
            if info is None:
                continue
            # ``Tensor(a)[]`` hides its set inside the list type; its source is the argument
            # whose annotation ends in the wildcard: ``Tensor(a -> *) self``.
            if sets & set(info.before_set) or (not sets and "*" in info.after_set):
                if not arg.kwarg_only and i < len(node.args):
                    return node.args[i]
                return node.kwargs.get(arg.name)
    return None


def returns_nothing(node: torch.fx.Node) -> bool:
    """Whether every schema of the node's op returns nothing (an op called for its effect)."""
    schemas = _schemas(node)
    return bool(schemas) and all(len(s.returns) == 0 for s in schemas)


def flat_nodes(args: Any) -> Iterator[Any]:
    """The leaves of nested lists, tuples and dicts of arguments, in order."""
    if isinstance(args, (list, tuple)):
        for arg in args:
            yield from flat_nodes(arg)
    elif isinstance(args, dict):
        for arg in args.values():
            yield from flat_nodes(arg)
    else:
        yield args
