"""Run an op in place when its input dies there: the output takes the input's bytes.

``relu(x)`` where nothing reads ``x`` afterwards can be ``relu_(x)``: the result needs no buffer
of its own. Eager PyTorch cannot do this (the input is still referenced while the op runs and
is freed only after), nor can a planner that keeps lifetimes half-open (``x`` lives during the
step that produces the output, so the two must not share bytes). Rewriting the graph first lets
the plan do it: the in-place op's result is an alias of its input, whose buffer simply lives
longer. Chains of elementwise ops (bias, activation, residual add, scaling) then run in one
buffer. This is the "in-place" option of memory planners such as MXNet's and TVM's.

A node ``f(a, ...)`` becomes ``f_(a, ...)`` when all of these hold:

- its op has an in-place overload with the same arguments (``add.Tensor`` → ``add_.Tensor``,
  ``pow.Tensor_Scalar`` → ``pow_.Scalar``), found from the schemas, and is not random;
- ``a``'s storage is an intermediate (never a parameter, buffer, input or constant), is not
  returned by the graph, and is read by no later node through any alias: this node is its last
  use, and no other argument of the node views it;
- ``a`` and the result have the same shape, strides and dtype, and ``a`` is dense with no
  overlapping elements (an ``expand``\\ ed view is not);
- the result is not (through aliases) a graph output, which must stay out of the arena.

Liveness comes from the planning front end on the original graph, updated as rewrites merge
buffers, so a rewrite never makes a later decision unsafe.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.torch_graph import is_tensor_like, meta_value

if TYPE_CHECKING:
    import torch.fx

__all__ = ["inplace_variant", "rewrite_inplace"]


def inplace_variant(op: Any) -> Any | None:
    """The in-place overload of a functional ATen op (``aten.relu.default`` →
    ``aten.relu_.default``), or None."""
    try:
        return _inplace_variant(op)
    except TypeError:  # unhashable: not an op overload
        return None


@functools.cache
def _inplace_variant(op: Any) -> Any | None:
    import torch

    schema = getattr(op, "_schema", None)
    packet = getattr(op, "overloadpacket", None)
    if schema is None or packet is None or schema.is_mutable or len(schema.returns) != 1:
        return None
    if schema.returns[0].alias_info is not None or str(schema.returns[0].type) != "Tensor":
        return None
    if torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()):
        return None
    namespace = getattr(torch.ops, op.namespace, None)
    inplace = getattr(namespace, f"{packet.__name__}_", None) if namespace else None
    if inplace is None:
        return None
    wanted = [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments]
    for name in inplace.overloads():
        candidate = getattr(inplace, name)
        arguments = candidate._schema.arguments
        if not arguments or arguments[0].alias_info is None or not arguments[0].alias_info.is_write:
            continue
        if [(a.name, str(a.type), a.kwarg_only) for a in arguments] == wanted:
            return candidate
    return None


def rewrite_inplace(graph: torch.fx.Graph, gp: GraphProblem) -> list[str]:
    """Rewrite ``graph`` (a copy: this changes node targets) to run ops in place where their
    first argument dies (see the module docstring); ``gp`` is its planning problem, for liveness.
    Returns the names of the rewritten nodes."""
    import torch

    nodes = list(graph.nodes)
    step = {node: i for i, node in enumerate(nodes)}
    planned = {b.id for b in gp.problem.buffers}
    end = {b.id: b.end for b in gp.problem.buffers}
    outputs = set(gp.outputs)
    merged: dict[str, str] = {}  # a rewritten node's own root -> the root it now writes into

    def root(name: str) -> str:
        name = gp.aliases.get(name, name)
        while name in merged:
            name = merged[name]
        return name

    rewritten: list[str] = []
    for node in nodes:
        if node.op != "call_function" or not node.args:
            continue
        inplace = inplace_variant(node.target)
        first = node.args[0]
        if inplace is None or not isinstance(first, torch.fx.Node):
            continue
        value, source = meta_value(node), meta_value(first)
        if not (is_tensor_like(value) and isinstance(source, torch.Tensor)):
            continue
        if first.target is operator.getitem or node.name not in planned:
            continue  # results of multi-output nodes are named apart; keep it simple
        target = root(first.name)
        if target not in planned or target in outputs or root(node.name) in outputs:
            continue
        if end[target] != step[node] + 1:
            continue  # read again later
        others = [a for a in node.all_input_nodes if a is not first]
        if any(root(a.name) == target for a in others):
            continue  # another argument views the bytes that would be overwritten
        if not _same_dense_layout(source, value):
            continue
        node.target = inplace
        mine = node.name
        end[target] = end[mine]
        merged[mine] = target
        rewritten.append(node.name)
    return rewritten


def _same_dense_layout(a: Any, b: Any) -> bool:
    if a.dtype != b.dtype or a.device != b.device:
        return False
    if _sizes(a.shape) != _sizes(b.shape) or _sizes(a.stride()) != _sizes(b.stride()):
        return False
    return _dense([_hint(s) for s in a.shape], [_hint(s) for s in a.stride()])


def _dense(sizes: list[int | None], strides: list[int | None]) -> bool:
    """True if the elements tile a contiguous range exactly once, in some dimension order."""
    if None in sizes or None in strides:
        return False  # a symbolic layout without example values: leave the node alone
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(sizes, strides, strict=True) if sz != 1):
        if stride != expected:
            return False
        expected *= size  # type: ignore[operator]
    return True


def _hint(size: Any) -> int | None:
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


def _sizes(values: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in values)


def hints(graph: torch.fx.Graph) -> Mapping[Any, int]:
    """Example values of the size symbols (from the placeholders' fake tensors), for liveness
    questions that do not depend on sizes."""
    import torch

    found: dict[Any, int] = {}
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        value = meta_value(node)
        sizes = (value,) if isinstance(value, torch.SymInt) else (
            (*value.shape, *value.stride()) if isinstance(value, torch.Tensor) else ())
        for size in sizes:
            sym = getattr(size, "node", None)
            expr = getattr(sym, "expr", None)
            hint = getattr(sym, "hint", None)
            if expr is not None and expr.is_symbol and isinstance(hint, int):
                found.setdefault(expr, hint)
    return found
