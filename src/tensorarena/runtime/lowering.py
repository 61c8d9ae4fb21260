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

2. :func:`~tensorarena.runtime.generated_code.generate` writes one Python function for the
   plan (each node's statement by :mod:`~tensorarena.runtime.node_statements`); it reads the
   lowering, so it sits above this module.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.torch_frontend import element_names
from tensorarena.planning.torch_graph import is_tensor_like, meta_value, op_name
from tensorarena.runtime.in_slot import (
    clone_in_slot,
    embedding_backward_in_slot,
    embedding_in_slot,
    written_in_slot,
)
from tensorarena.runtime.ops import out_differs, out_variant
from tensorarena.runtime.scalars import hoisted, mean_as_sum

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = ["PATHS", "Lowering", "NodePath", "Unplaceable", "classify"]

#: Every path a node can take, in report order.
PATHS = ("out", "copy", "alias", "dynamic", "pool", "other")
Path = Literal["out", "copy", "alias", "dynamic", "pool", "other"]
Unplaceable = Literal["auto", "copy", "dynamic"]
#: With ``unplaceable="auto"``, results read for at most this many steps stay dynamic.
SHORT_LIVED_STEPS = 3


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
        value = meta_value(node)
        if is_tensor_like(value):
            names: list[str | None] = [node.name]
        elif isinstance(value, (list, tuple)) and node.target is not operator.getitem:
            names = [
                name if is_tensor_like(v) else None
                for name, v in zip(element_names(node, len(value)), value, strict=True)
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
    return op_name(node).endswith("_") and not op_name(node).endswith("__")

