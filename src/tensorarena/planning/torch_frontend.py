"""Planning problems from PyTorch graphs: ``torch.export`` programs and ``torch.fx`` graph modules.

One buffer per tensor a node creates in fresh storage, sized from its shape, strides and dtype (the
storage extent, so a padded or strided output counts every byte it spans). Views and in-place
results are not new buffers: they alias their base and keep its root alive as long as they are
used. Parameters, module buffers, constants and user inputs are left out of the plan and reported
with their sizes. Time is the node index in ``graph.nodes``; see
:mod:`~tensorarena.planning.graph_problem`.

Aliasing is decided by the graph walk (:mod:`~tensorarena.planning.torch_walk`: ATen's own
rules first, then storage identity, then the op's schema; its known limits are listed there).

:func:`trace_training` (:mod:`~tensorarena.planning.torch_training`) traces forward, loss and
``torch.autograd.grad`` together with ``make_fx``, so the training graph's saved activations and
gradients are planned too. Its names, and the walk's, are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.torch_graph import Bindings, meta_value, storage_key
from tensorarena.planning.torch_training import KIND_KEY as KIND_KEY
from tensorarena.planning.torch_training import SOURCE_KEY as SOURCE_KEY
from tensorarena.planning.torch_training import TRACING_MODE_KEY as TRACING_MODE_KEY
from tensorarena.planning.torch_training import (
    data_dependent_errors,
    default_loss,
    trace_training,
)
from tensorarena.planning.torch_walk import METADATA_ONLY_OPS, element_names, walk_graph

if TYPE_CHECKING:
    import torch
    import torch.fx

__all__ = [
    "METADATA_ONLY_OPS",
    "data_dependent_errors",
    "default_loss",
    "element_names",
    "exported_problems",
    "problem_from_exported",
    "problem_from_fx",
    "trace_training",
]


def problem_from_exported(
    ep: torch.export.ExportedProgram,
    *,
    alignment: int = 64,
    name: str = "",
    bindings: Bindings | None = None,
    graph: torch.fx.Graph | None = None,
) -> GraphProblem:
    """The planning problem of an ``ExportedProgram`` (from ``torch.export.export``).

    Inputs are classified by the program's graph signature: parameters, module buffers, lifted
    constants and user inputs are unplanned. Every buffer gets ``alignment``. A program exported
    with dynamic dimensions is planned for one shape: ``bindings`` gives each size symbol
    (``s0``, a sympy symbol) its value. ``graph`` walks a rewritten copy of ``ep.graph`` (same
    placeholders, same signature) instead of the program's own.
    """
    return exported_problems(ep, alignment=alignment, name=name)(
        ep.graph if graph is None else graph, bindings)


def exported_problems(
    ep: torch.export.ExportedProgram, *, alignment: int = 64, name: str = ""
) -> Callable[[torch.fx.Graph, Bindings | None], GraphProblem]:
    """:func:`problem_from_exported` of ``ep`` as a function of (a rewritten copy of) its graph
    and the size symbols' values, holding what it reads of ``ep`` (the inputs' kinds, the tied
    weights) and not ``ep`` itself: a program keeps this, and not the exported program's graph."""
    th = load_torch()
    if not isinstance(ep, th.export.ExportedProgram):
        raise InvalidArgumentError(
            f"expected a torch.export.ExportedProgram, got {type(ep).__name__} {ep!r:.60}")
    from torch.export.graph_signature import InputKind

    kinds = {
        InputKind.PARAMETER: "parameter",
        InputKind.BUFFER: "buffer",
        InputKind.CONSTANT_TENSOR: "constant",
        InputKind.USER_INPUT: "input",
    }
    by_name = {
        spec.arg.name: kinds.get(spec.kind, "input")
        for spec in ep.graph_signature.input_specs
        if hasattr(spec.arg, "name")
    }

    # Tied weights (an LM head sharing the embedding) are two placeholders over one tensor:
    # the second is an alias of the first, not more bytes.
    tensors = {**ep.state_dict, **ep.constants}
    first_of: dict[int, str] = {}
    tied: dict[str, str] = {}
    for spec in ep.graph_signature.input_specs:
        value = tensors.get(spec.target) if spec.target is not None else None
        key = storage_key(value)
        if key is not None and hasattr(spec.arg, "name"):
            tied_to = first_of.setdefault(key, spec.arg.name)
            if tied_to != spec.arg.name:
                tied[spec.arg.name] = tied_to
    del tensors, first_of

    def kind_of(node: torch.fx.Node) -> str:
        return by_name.get(node.name, "input")

    def problem(graph: torch.fx.Graph, bindings: Bindings | None) -> GraphProblem:
        return walk_graph(graph, kind_of, lambda node: None, tied=tied, alignment=alignment,
                          name=name, bindings=bindings)

    return problem


def problem_from_fx(
    gm: torch.fx.GraphModule,
    *,
    alignment: int = 64,
    name: str = "",
    bindings: Bindings | None = None,
) -> GraphProblem:
    """The planning problem of a ``GraphModule`` whose nodes carry shapes.

    Shapes come from ``node.meta["val"]`` (``make_fx``, export), ``["example_value"]`` (dynamo) or
    ``node.meta["tensor_meta"]`` (``torch.fx.passes.shape_prop.ShapeProp``). Placeholders are
    unplanned inputs, unless :func:`trace_training` marked them as parameters or buffers or
    their value is a ``Parameter`` (dynamo); ``get_attr`` tensors are unplanned parameters,
    buffers or constants. ``bindings`` gives values to size symbols, as for
    :func:`problem_from_exported`.
    """
    th = load_torch()
    params = {id(p) for p in gm.parameters()}
    buffers = {id(b) for b in gm.buffers()}

    def kind_of(node: torch.fx.Node) -> str:
        if KIND_KEY in node.meta:
            return str(node.meta[KIND_KEY])
        # Dynamo lifts parameters to placeholders whose example value is still a Parameter.
        return "parameter" if isinstance(meta_value(node), th.nn.Parameter) else "input"

    def attr_of(node: torch.fx.Node) -> tuple[Any, str] | None:
        value: Any = gm
        try:
            for part in str(node.target).split("."):
                value = getattr(value, part)
        except AttributeError:
            return None
        if not isinstance(value, th.Tensor):
            return None
        kind = "parameter" if id(value) in params else "buffer" if id(value) in buffers else None
        return value, kind or "constant"

    return walk_graph(gm.graph, kind_of, attr_of, alignment=alignment, name=name,
                      bindings=bindings)
