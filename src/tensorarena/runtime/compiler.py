"""The mutable state of one :class:`~tensorarena.runtime.PlannedProgram`'s execution.

A :class:`Compiler` holds what the stages below the program read and change while it runs: the
options they act on, the workspace and the dynamic pool, the order the nodes run in
(:class:`~tensorarena.runtime.run_graph.RunGraph`), the cache of shapes
(:class:`~tensorarena.runtime.specialization.Specialization`), the nodes demoted to the copy
path and the latest call's bindings. The stages (:mod:`~tensorarena.runtime.shape_plans`,
:mod:`~tensorarena.runtime.shape_code`, :mod:`~tensorarena.runtime.kernel_recording`, ...) are
functions that take it; it imports none of them, so they import each other in one direction and
none of them imports the program.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from tensorarena._optional import load_torch
from tensorarena.planning.torch_graph import free_symbols
from tensorarena.runtime.device import off_device
from tensorarena.runtime.kernel_state import KernelNote, kernel_note
from tensorarena.runtime.reordering import reordered
from tensorarena.runtime.run_graph import ProblemOf, RunGraph, prepare, result_values
from tensorarena.runtime.shapes import ShapeBinder, growing_symbols

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.planning.graph_problem import GraphProblem
    from tensorarena.runtime.lowering import Unplaceable
    from tensorarena.runtime.options import OutputPlacement, ProgramOptions
    from tensorarena.runtime.signature import Signature
    from tensorarena.runtime.specialization import Specialization
    from tensorarena.runtime.workspace import Workspace

__all__ = ["Compiler", "KernelPolicy"]

#: Which kernel allocations are planned: every one, those that keep the arena's height, or
#: whichever of the two gives the lower peak (the program's ``kernel_arena`` option).
KernelPolicy = Literal["all", "idle", "lower"]


class Compiler:
    """What a program's stages share while it runs (module docstring). Made by the program
    from its checked :class:`~tensorarena.runtime.options.ProgramOptions`."""

    def __init__(self, gm: torch.fx.GraphModule, problem_of: ProblemOf, signature: Signature,
                 options: ProgramOptions, *, device: str, workspace: Workspace,
                 ranges: Mapping[Any, tuple[int | None, int | None]] | None) -> None:
        outputs, reorder, kernel_arena = options.outputs, options.reorder, options.kernel_arena
        time_limit, inplace = options.time_limit, options.inplace
        self.outputs: OutputPlacement = outputs
        self.device = device
        self.workspace = workspace
        self.pool = options.pool  #: the resource of the dynamic pool (growing dimensions)
        self.planner = options.planner
        self.time_limit = time_limit
        self.unplaceable: Unplaceable = options.unplaceable
        self.inplace = inplace
        self.poison = options.poison
        self.mkl_buffers = options.mkl_buffers  #: consolidate MKL's buffers after a first call
        self.max_plans = options.max_plans
        self.signature = signature
        #: the graph as given (traced order) and its problem, while ``reorder=True``'s first
        #: recorded call may still make orders from it; ``None`` once none will (the program
        #: then holds one graph: the one it runs)
        self.given: tuple[torch.fx.GraphModule, ProblemOf] | None = (
            (gm, problem_of) if options.reorder is True else None)
        #: the shapes planned, by the values of their key symbols (least recently used first)
        self.cache: OrderedDict[tuple[int, ...], Specialization] = OrderedDict()
        #: with ``max_shapes``: the plan for the maximum shapes (made at the first call)
        self.max_shape: Specialization | None = None
        #: the order the nodes run in, when ``reorder=True`` (a ``planning.reorder.Schedule``)
        self.schedule: Any = None
        ordered = gm
        if reorder:
            ordered, _, self.schedule = reordered(
                gm, problem_of, time_limit, always=reorder == "always",
                with_outputs=outputs != "fresh")
        self.reordered = ordered is not gm  #: whether the nodes run in ``schedule``'s order
        self.adopt(prepare(ordered, problem_of, inplace=inplace))
        #: the kernel order's estimates, by candidate (:mod:`~tensorarena.runtime.kernel_order`)
        self.order_estimates: dict[str, int] = {}
        #: whether the first recorded call still chooses the order again (``reorder=True``)
        self.order_open = reorder is True
        self.binder = ShapeBinder(self.graph, signature.checked, ranges=ranges,
                                  check=signature.check, grad_watched=signature.grad_watched)
        self.growing = growing_symbols(self.binder, options.growing)
        #: the symbols a shape is cached by (growing ones never make a new plan)
        self.key_symbols = tuple(s for s in self.binder.symbols if s not in self.growing)
        self.max_bindings: dict[Any, int] | None = None
        if options.max_shapes is not None:
            self.max_bindings = self.binder.bind_shapes(options.max_shapes)
            self.binder.limit({s: v for s, v in self.max_bindings.items()
                               if s not in self.growing})
        #: nodes whose out variant failed, with why: they take the copy path from then on
        self.demoted: dict[str, str] = {}
        self.last: Specialization | None = None  #: the shape of the latest call
        self.bindings: Mapping[Any, int] = {}  #: the size symbols' values of the latest call
        self.values = result_values(self.graph)  #: each node's result value
        self.elsewhere = off_device(self.values, device)
        self.no_grad = load_torch().no_grad
        #: the arena the latest annotated call ran in (read by the memory recording)
        self.annotated_memory: torch.Tensor | None = None
        #: a new shape's state with its kernels' allocations (:mod:`.kernel_state`)
        self.kernel_note: KernelNote = kernel_note(kernel_arena is not False, device,
                                                   options.max_shapes is not None)
        self.kernel_policy: KernelPolicy = kernel_arena if isinstance(kernel_arena, str) else (
            "all" if outputs == "arena" else "lower")
        self.plans_made = 0  #: how many plans were computed

    def adopt(self, run: RunGraph) -> None:
        """Run ``run`` from now on: every shape planned for another order is dropped (each is
        planned anew at its next call)."""
        for stale in self.cache.values():
            stale.retired = True
        self.cache.clear()
        self.max_shape = None
        self.run = run
        self.gm, self.graph = run.gm, run.graph
        #: the planning problem of the running graph at given values of the size symbols
        self.problem_of: Callable[[Mapping[Any, int]], GraphProblem] = run.problem_of

    def pooled(self) -> set[str]:
        """The buffers of growing dimensions: allocated per call from the dynamic pool."""
        if not self.growing:
            return set()
        return {name for name, value in self.values.items()
                if free_symbols(value) & self.growing}
