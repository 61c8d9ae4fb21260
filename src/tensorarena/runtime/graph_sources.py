"""Where a :class:`~tensorarena.runtime.PlannedProgram`'s graph comes from.

Each source gives what a program is built from: the ``GraphModule`` to run, the function that
builds the planning problem of (a reordering of) its graph at given values of its size symbols
(:data:`~tensorarena.runtime.run_graph.ProblemOf`), and the :mod:`signature
<tensorarena.runtime.signature>` that turns a call's arguments into placeholders and back.
:func:`export_module` is ``torch.export.export`` with torch's error wrapped in one that says
what to try instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensorarena.errors import ExportFailedError, InvalidArgumentError
from tensorarena.runtime.materialize import _torch
from tensorarena.runtime.reordering import with_graph
from tensorarena.runtime.run_graph import ProblemOf
from tensorarena.runtime.shapes import ranges_of
from tensorarena.runtime.signature import ExportedSignature, FlatSignature, Signature

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.planning.graph_problem import GraphProblem

__all__ = ["GraphSource", "export_module", "from_exported", "from_graph_module"]


@dataclass(frozen=True, eq=False)
class GraphSource:
    """A program's graph, its problem, its calling convention and the options they imply."""

    gm: torch.fx.GraphModule
    problem_of: ProblemOf
    signature: Signature
    options: dict[str, Any] = field(default_factory=dict)  #: name, reference, ranges


def from_exported(ep: torch.export.ExportedProgram, name: str) -> GraphSource:
    """The source of an ``ExportedProgram`` (called as ``ep.module()`` is)."""
    from tensorarena.planning.torch_frontend import problem_from_exported

    if not isinstance(ep, _torch().export.ExportedProgram):
        raise InvalidArgumentError(
            f"from_exported takes a torch.export.ExportedProgram, got {type(ep).__name__} "
            "(for a module: PlannedProgram.from_module(model, (x,)))"
        )
    name = name or "exported"

    def problem_of(graph: torch.fx.Graph, bindings: Mapping[Any, int]) -> GraphProblem:
        return problem_from_exported(ep, name=name, bindings=bindings or None, graph=graph)

    return GraphSource(ep.graph_module, problem_of, ExportedSignature(ep),
                       {"name": name, "reference": ep.module(), "ranges": ranges_of(ep)})


def export_module(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any],
                  *, dynamic_shapes: Any, strict: bool) -> torch.export.ExportedProgram:
    """``torch.export.export`` under ``no_grad``; its failure raises
    :class:`ExportFailedError` carrying torch's error and what to try."""
    th = _torch()
    try:
        with th.no_grad():
            ep: torch.export.ExportedProgram = th.export.export(
                model, tuple(args), dict(kwargs), dynamic_shapes=dynamic_shapes, strict=strict)
            return ep
    except Exception as exc:
        raise ExportFailedError(
            f"torch.export could not capture {type(model).__name__}: "
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}\n"
            "What to try: torch.compile(model, backend='tensorarena'), which plans the parts "
            "export cannot capture whole (graph breaks); strict=False if you passed True; "
            "a dynamic_shapes spec if a dimension changes between calls; or export the model "
            "yourself and pass the program to PlannedProgram.from_exported"
        ) from exc


def from_graph_module(gm: torch.fx.GraphModule, name: str, *,
                      input_names: Sequence[str] | None, check_inputs: bool,
                      signature: Signature | None) -> GraphSource:
    """The source of an FX ``GraphModule`` whose nodes carry shapes, called with its
    placeholders in order unless ``signature`` says otherwise."""
    from tensorarena.planning.torch_frontend import problem_from_fx

    if not isinstance(gm, _torch().fx.GraphModule):
        raise InvalidArgumentError(
            f"from_graph_module takes a torch.fx.GraphModule, got {type(gm).__name__} "
            "(for a module: PlannedProgram.from_module(model, (x,)))"
        )
    name = name or "graph"

    def problem_of(graph: torch.fx.Graph, bindings: Mapping[Any, int]) -> GraphProblem:
        owner = gm if graph is gm.graph else with_graph(gm, graph)
        return problem_from_fx(owner, name=name, bindings=bindings or None)

    return GraphSource(gm, problem_of,
                       signature or FlatSignature(gm, input_names, check=check_inputs),
                       {"name": name})
