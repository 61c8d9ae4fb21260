"""The graph a :class:`~tensorarena.runtime.PlannedProgram` runs, in one order, ready to plan.

:func:`prepare` takes a module whose graph is in the order to run (the caller's, or one that
:mod:`~tensorarena.runtime.reordering` made) and makes the program's own copy of it, with the
rewrites that depend on the order: a contiguous copy before each broadcast matrix operand
(:mod:`~tensorarena.runtime.operands`) and elementwise ops run in place where their input dies
(:mod:`~tensorarena.runtime.inplace`, decided on this order's lifetimes). A program holds one
:class:`RunGraph` at a time and may trade it for another once kernels' allocations are known
(:mod:`~tensorarena.runtime.kernel_order`); every shape it plans is planned on the one it holds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorarena.planning.torch_graph import meta_value
from tensorarena.runtime.inplace import hints, rewrite_inplace
from tensorarena.runtime.operands import contiguous_operands
from tensorarena.runtime.reordering import copied

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.planning.graph_problem import GraphProblem

__all__ = ["ProblemOf", "RunGraph", "prepare", "result_values"]

#: The planning problem of a graph of the program's at given values of its size symbols.
ProblemOf = Callable[["torch.fx.Graph", Mapping[Any, int]], "GraphProblem"]


@dataclass(frozen=True, eq=False)
class RunGraph:
    """A program's own copy of its graph in one order, with the rewrites made on it."""

    gm: torch.fx.GraphModule  #: the module whose graph runs (shares the caller's parameters)
    graph: torch.fx.Graph  #: ``gm.graph``: the nodes in the order they run
    #: matrix products whose broadcast operand is first copied into a planned buffer
    contiguous_operands: tuple[str, ...]
    inplace_nodes: tuple[str, ...]  #: nodes rewritten to run in place
    #: the planning problem of :attr:`graph` at given values of the size symbols
    problem_of: Callable[[Mapping[Any, int]], GraphProblem]

    @property
    def order(self) -> tuple[str, ...]:
        """Node names in the order they run (the copies of broadcast operands included)."""
        return tuple(node.name for node in self.graph.nodes)


def prepare(gm: torch.fx.GraphModule, problem_of: ProblemOf, *, inplace: bool) -> RunGraph:
    """A copy of ``gm`` (nodes in its graph's order) with the program's rewrites made on it;
    ``gm`` itself is left as it is."""
    module, graph = copied(gm)
    operands = tuple(contiguous_operands(graph))
    rewritten: tuple[str, ...] = ()
    if inplace:
        rewritten = tuple(rewrite_inplace(graph, problem_of(graph, hints(graph))))
    return RunGraph(module, graph, operands, rewritten, functools.partial(problem_of, graph))


def result_values(graph: torch.fx.Graph) -> dict[str, Any]:
    """Tensor name → its (fake, possibly symbolic) value, as the front end names results."""
    import operator

    from tensorarena.planning.torch_frontend import element_names
    from tensorarena.planning.torch_graph import is_tensor_like

    values: dict[str, Any] = {}
    for node in graph.nodes:
        value = meta_value(node)
        if is_tensor_like(value):
            values[node.name] = value
        elif isinstance(value, (list, tuple)) and node.target is not operator.getitem:
            for name, v in zip(element_names(node, len(value)), value, strict=True):
                if is_tensor_like(v):
                    values[name] = v
    return values
