"""The graph a :class:`~tensorarena.runtime.PlannedProgram` runs: a copy of the one given, in
the order :func:`tensorarena.planning.reorder` picks when asked.

The copy is the program's own (in-place rewriting and operand copies edit it; the caller's module
is left as it was) and shares the caller's parameters and buffers. Reordering is judged by the
lower bound of what the arena plans (:func:`arena_bound`), which is not reorder's own objective
when the outputs stay out of the arena (see :func:`reordered`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tensorarena.planning.problem import Problem, lower_bound
from tensorarena.runtime.inplace import hints
from tensorarena.runtime.torch_residue import forget_source

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.planning.graph_problem import GraphProblem

__all__ = ["REORDER_TIME_LIMIT", "arena_bound", "copied", "reordered", "with_graph"]

#: The outer bound, in seconds, of a program's search over orders. The search's budget of work
#: steps (:data:`~tensorarena.planning.budget.DEFAULT_REORDER_STEPS`) ends it first on the models
#: measured, so a program runs the same order on any machine under any load; the program's
#: ``time_limit`` bounds only its plans. (The search used to stop at ``time_limit``, two seconds
#: by default: where the clock ended it, the order, and the arena, depended on the load.)
REORDER_TIME_LIMIT = 120.0


def copied(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, torch.fx.Graph]:
    """A copy of ``gm``'s graph (nodes, names and metadata) in a module sharing its attributes."""
    import torch.fx

    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen  # how to (un)flatten inputs and outputs: unchanged
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    return with_graph(gm, graph), graph


def reordered(
    gm: torch.fx.GraphModule,
    problem_of: Callable[[torch.fx.Graph, Mapping[Any, int]], GraphProblem],
    time_limit: float,
    *,
    always: bool,
    with_outputs: bool,
) -> tuple[torch.fx.GraphModule, torch.fx.Graph, Any]:
    """``gm`` with its nodes in the order :func:`tensorarena.planning.reorder` picks for the
    graph's planning problem (at the example shapes), and that schedule; ``gm`` as it is (and
    the schedule) when that order would not lower the peak of what *this* runtime plans.

    The two objectives differ: reorder counts the graph's outputs, which live to the end of
    every order, while the arena leaves them out (they are fresh for the caller). An order that
    frees activations sooner by producing gradients later can lower the one and raise the
    other (tiny BERT's training step did: ``bench/RESULTS.md``). With
    ``with_outputs`` (outputs planned in the arena) the objectives are the same."""
    from tensorarena.planning.op_graph import op_graph_from_fx, reordered_graph
    from tensorarena.planning.reorder import reorder
    from tensorarena.runtime.materialize import BLOCK_ALIGNMENT

    graph = gm.graph
    sizes = hints(graph)
    given = problem_of(graph, sizes)
    ops = op_graph_from_fx(graph, given)
    schedule = reorder(ops, time_limit=max(time_limit, REORDER_TIME_LIMIT),
                       plan_time_limit=time_limit, alignment=BLOCK_ALIGNMENT).schedule
    new = reordered_graph(graph, schedule.order)
    new._codegen = graph._codegen  # inputs and outputs (un)flatten as before
    module = with_graph(gm, new)
    bound = functools.partial(arena_bound, with_outputs=with_outputs)
    if not always and bound(problem_of(new, sizes)) > bound(given):
        return gm, graph, schedule
    return module, new, schedule


def arena_bound(graph: GraphProblem, *, with_outputs: bool) -> int:
    """The lower bound of the buffers this runtime plans: all but the graph's outputs, unless
    ``with_outputs``."""
    outputs = set() if with_outputs else set(graph.outputs)
    return lower_bound(Problem(b for b in graph.problem.buffers if b.id not in outputs))


def with_graph(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A module running ``graph`` over ``gm``'s parameters, buffers and submodules."""
    module = _graph_module_class()(gm, graph)
    forget_source(module)  # FX would keep its source for the process (runtime.torch_residue)
    # Parameters and buffers by identity, so the front end tells parameters from constants.
    return module


def _graph_module_class() -> type[torch.fx.GraphModule]:
    """FX's lazy module where this torch has it: it writes and compiles the module's Python
    source only when something reads it or calls the module, which a program never does on its
    way (it runs code of its own); Llama 125M's source and code were 0.65 MiB the program held."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:  # a torch without it: the module writes its source now
        import torch.fx

        return torch.fx.GraphModule
    return _LazyGraphModule
