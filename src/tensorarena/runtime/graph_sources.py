"""Where a :class:`~tensorarena.runtime.PlannedProgram`'s graph comes from.

Each source gives what a program is built from: the ``GraphModule`` to run, the function that
builds the planning problem of (a reordering of) its graph at given values of its size symbols
(:data:`~tensorarena.runtime.run_graph.ProblemOf`), and the :mod:`signature
<tensorarena.runtime.signature>` that turns a call's arguments into placeholders and back.
:func:`export_module` (from :mod:`~tensorarena.runtime.exporting`) is ``torch.export.export``
with what it needs first and torch's errors turned into ours; every exported program is checked
for sizes that depend on the inputs' values before it is planned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.errors import InvalidArgumentError
from tensorarena.runtime.export_process import reloader
from tensorarena.runtime.exporting import check_sizes_follow_shapes, export_module
from tensorarena.runtime.reordering import with_graph
from tensorarena.runtime.run_graph import ProblemOf
from tensorarena.runtime.shapes import ranges_of
from tensorarena.runtime.signature import ExportedSignature, FlatSignature, Signature
from tensorarena.runtime.torch_residue import caches_as_they_were

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
    from tensorarena.planning.torch_frontend import exported_problems

    if not isinstance(ep, load_torch().export.ExportedProgram):
        raise InvalidArgumentError(
            f"from_exported takes a torch.export.ExportedProgram, got {type(ep).__name__} "
            "(for a module: PlannedProgram.from_module(model, (x,)))"
        )
    name = name or "exported"
    check_sizes_follow_shapes(ep.graph, name)

    problems = exported_problems(ep, name=name)  # holds what it reads of ep, not ep

    def problem_of(graph: torch.fx.Graph, bindings: Mapping[Any, int]) -> GraphProblem:
        return problems(graph, bindings or None)

    return GraphSource(ep.graph_module, problem_of, ExportedSignature(ep),
                       {"name": name, "reference": _Unlifted(ep), "ranges": ranges_of(ep)})


class _Unlifted:
    """``ep.module()``, made at its first call (``verify``'s reference): the unlifted copy of
    the graph costs megabytes that a program which is never verified does not need (Llama
    125M: its export's nodes and code again). A program exported in a child process holds
    not ``ep`` but what the child sent, and reads ``ep`` back from it then: the program keeps
    one graph, the one it runs (the exported program's graph and fake values are 4 MiB of
    objects for Llama 125M, ``bench/RESULTS.md``)."""

    def __init__(self, ep: torch.export.ExportedProgram) -> None:
        #: reads the export back from what the child sent, or returns ``ep`` (exported here)
        self._load: Callable[[], torch.export.ExportedProgram] = reloader(ep) or (lambda: ep)
        self._module: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._module is None:
            with caches_as_they_were():  # FX would keep its modules' sources for the process
                self._module = self._load().module()
        return self._module(*args, **kwargs)


def from_graph_module(gm: torch.fx.GraphModule, name: str, *,
                      input_names: Sequence[str] | None, check_inputs: bool,
                      signature: Signature | None) -> GraphSource:
    """The source of an FX ``GraphModule`` whose nodes carry shapes, called with its
    placeholders in order unless ``signature`` says otherwise."""
    from tensorarena.planning.torch_frontend import problem_from_fx

    if not isinstance(gm, load_torch().fx.GraphModule):
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
