"""``PlannedProgram``: a PyTorch graph run node by node, every intermediate at its planned offset.

Built from a ``torch.export`` program, a module, or an FX graph with shapes. It holds its checked
options (:class:`~tensorarena.runtime.options.ProgramOptions`, where each option is described)
and a :class:`~tensorarena.runtime.compiler.Compiler`, the state the stages below share; a call
is :func:`~tensorarena.runtime.execute.execute`, a report
:func:`~tensorarena.runtime.report.latest_report`, the one-off calls (verify, traced, recorded)
:mod:`~tensorarena.runtime.verification`, :mod:`~tensorarena.runtime.one_off` and
:mod:`~tensorarena.runtime.recording`. None of the stages imports this module; the pipeline,
stage by stage: ``docs/architecture.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorarena.errors import (
    ExportFailedError,
    InvalidArgumentError,
    PlanVerificationError,
    ShapeNotCoveredError,
)
from tensorarena.runtime import graph_sources
from tensorarena.runtime.compiler import Compiler
from tensorarena.runtime.device import graph_device
from tensorarena.runtime.execute import execute
from tensorarena.runtime.measure import AllocatorTrace
from tensorarena.runtime.one_off import give_back, give_back_planning, traced_call
from tensorarena.runtime.options import ProgramOptions, check_example, workspace_for
from tensorarena.runtime.output_placement import OutputPlacement
from tensorarena.runtime.report import ExecutionReport, latest_report
from tensorarena.runtime.signature import Signature
from tensorarena.runtime.torch_residue import caches_as_they_were
from tensorarena.runtime.variants import Variants, exported_again
from tensorarena.runtime.verification import verify_call
from tensorarena.runtime.workspace import Workspace

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.planning.graph_problem import GraphProblem

__all__ = ["ExportFailedError", "OutputPlacement", "PlanVerificationError", "PlannedProgram"]


class PlannedProgram:
    """A graph run in one planned arena; call it like the program it was built from.

    Calls run under ``torch.no_grad()``: outputs carry no autograd history (the first such call
    of an exported program warns, :class:`~tensorarena.errors.NoGradWarning`; for gradients:
    :class:`~tensorarena.runtime.TrainingStep`, or ``torch.compile(model, backend="tensorarena")``).
    A call must be laid out as the example it was built with, each tensor of the dtype and on
    the device built with; every other argument is baked into the graph, and a call with
    another value is served by a program exported again for it (:meth:`from_module`) or refused
    (:class:`~tensorarena.errors.ShapeNotCoveredError`), never run with the values built with.

    Use :meth:`from_exported`, :meth:`from_module` or :meth:`from_graph_module`. Keyword-only
    options: ``workspace`` (a :class:`Workspace` shared with programs that never run at the
    same time) and those of :class:`~tensorarena.runtime.options.ProgramOptions` (where each is
    described), checked before anything is planned.
    """

    def __init__(self, gm: torch.fx.GraphModule,
                 problem_of: Callable[[torch.fx.Graph, Mapping[Any, int]], GraphProblem],
                 signature: Signature, *, name: str = "",
                 reference: Callable[..., Any] | None = None,
                 ranges: Mapping[Any, tuple[int | None, int | None]] | None = None,
                 workspace: Workspace | None = None, **options: Any) -> None:
        #: the checked options (a wrong one raised before anything was planned)
        self.options = ProgramOptions(**options)
        self.name = name
        self.outputs: OutputPlacement = self.options.outputs  #: where outputs live
        #: where the arena lives: the graph's device (:mod:`~tensorarena.runtime.device`)
        self.device = graph_device(gm.graph)
        self.workspace = workspace_for(workspace, self.options.resource, self.device,
                                       self.options.concurrency)
        #: the state the stages share while the program runs (shapes cached, order, demoted)
        self.compiler = Compiler(gm, problem_of, signature, self.options, device=self.device,
                                 workspace=self.workspace, ranges=ranges)
        self._signature = signature
        self._reference = reference
        self._variants: Variants | None = None  #: exported again for other values (from_module)
        self._latest: PlannedProgram | None = None  #: the variant that served the latest call
        self._placeholders = sum(node.op == "placeholder" for node in gm.graph.nodes)

    @property
    def schedule(self) -> Any:
        """The order the nodes run in, when ``reorder=True`` (a ``planning.reorder.Schedule``)."""
        return self.compiler.schedule

    @property
    def reordered(self) -> bool:
        """Whether the nodes run in :attr:`schedule`'s order."""
        return self.compiler.reordered

    @property
    def order_estimates(self) -> dict[str, int]:
        """The kernel order's estimates, by candidate (:mod:`~tensorarena.runtime.kernel_order`)."""
        return self.compiler.order_estimates

    @property
    def plans_made(self) -> int:
        """How many plans were computed (one per new shape without ``max_shapes``)."""
        return self.compiler.plans_made

    @property
    def contiguous_operands(self) -> tuple[str, ...]:
        """Matrix products whose broadcast operand is first copied into a planned buffer."""
        return self.compiler.run.contiguous_operands

    @property
    def inplace_nodes(self) -> tuple[str, ...]:
        """Nodes rewritten to run in place."""
        return self.compiler.run.inplace_nodes

    @classmethod
    def from_exported(cls, ep: torch.export.ExportedProgram, **options: Any) -> PlannedProgram:
        """Plan and run an ``ExportedProgram``; call the result as ``ep.module()`` is called.
        A call with non-tensor values other than those exported with raises
        :class:`~tensorarena.errors.ShapeNotCoveredError` naming it (no module to export again)."""
        return cls._from(graph_sources.from_exported(ep, options.pop("name", "")), options)

    @classmethod
    def from_module(cls, model: torch.nn.Module, args: Sequence[Any] = (),
                    kwargs: Mapping[str, Any] | None = None, *, dynamic_shapes: Any = None,
                    strict: bool = False, isolate_export: bool | None = None,
                    **options: Any) -> PlannedProgram:
        """Export ``model`` with ``torch.export.export`` (under ``no_grad``, in the mode it is
        in: call ``model.eval()`` first for inference) and plan the program; a model that cannot
        be exported raises :class:`ExportFailedError` carrying torch's error. A call with other
        non-tensor values (``n=5``) exports ``model`` again with them and plans that graph in
        this workspace, kept like a shape's plan (:mod:`~tensorarena.runtime.variants`).
        The export runs in a child process where it can (``isolate_export``; by default where
        the platform forks, no other Python thread runs and CUDA is not yet initialised), so that
        what it imports and caches does not stay in this one
        (:mod:`~tensorarena.runtime.export_process`)."""
        check_example(args, kwargs)
        with caches_as_they_were():  # what the export leaves in torch's caches
            ep = graph_sources.export_module(model, args, kwargs or {},
                                             dynamic_shapes=dynamic_shapes, strict=strict,
                                             isolated=isolate_export)
        options.setdefault("name", type(model).__name__)
        program = cls.from_exported(ep, **options)
        layout = program._signature.layout
        if layout is not None and layout.baked:
            program._variants = exported_again(
                model, cls.from_exported, layout, options, program.workspace,
                dynamic_shapes=dynamic_shapes, strict=strict, isolated=isolate_export)
        return program

    @classmethod
    def from_graph_module(cls, gm: torch.fx.GraphModule, *,
                          input_names: Sequence[str] | None = None, check_inputs: bool = True,
                          **options: Any) -> PlannedProgram:
        """Plan and run an FX ``GraphModule`` whose nodes carry shapes (``make_fx``, export,
        dynamo, ``aot_autograd``); call it with the graph's placeholders in order.
        ``check_inputs=False`` skips the shape checks (for callers that guard already). A
        non-tensor placeholder is passed as given (``make_fx`` baked the traced values in)."""
        source = graph_sources.from_graph_module(
            gm, options.pop("name", ""), input_names=input_names, check_inputs=check_inputs,
            signature=options.pop("signature", None))
        options.setdefault("reference", gm)
        return cls._from(source, options)

    @classmethod
    def _from(cls, source: graph_sources.GraphSource, options: dict[str, Any]) -> PlannedProgram:
        with caches_as_they_were():  # what planning leaves in torch's caches
            program = cls(source.gm, source.problem_of, source.signature,
                          **{**source.options, **options})
        give_back_planning(program.compiler)
        return program

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            inputs = self._signature.flatten(args, kwargs)
        except ShapeNotCoveredError:  # a non-tensor argument other than the graph's
            if (other := self._other(args, kwargs)) is None:
                raise
            self._latest = other
            return other(*args, **kwargs)
        self._latest = None
        return self._signature.unflatten(execute(self.compiler, inputs), inputs)

    def program_for(self, *args: Any, **kwargs: Any) -> PlannedProgram:
        """The program that serves a call with these arguments: this one, or (:meth:`from_module`)
        the one exported again for their non-tensor values (made now if new). Raises as a call
        would where none can serve them."""
        try:
            self._signature.flatten(args, kwargs)
        except ShapeNotCoveredError:
            if (other := self._other(args, kwargs)) is None:
                raise
            return other
        return self

    def _other(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PlannedProgram | None:
        return None if self._variants is None else self._variants.program_for(args, kwargs)

    def run_flat(self, inputs: list[Any]) -> Any:
        """Run with the placeholder values in graph order; return the graph's flat outputs."""
        if len(inputs) != self._placeholders:
            raise InvalidArgumentError(
                f"run_flat takes the graph's {self._placeholders} placeholder values "
                f"(parameters and buffers included), got {len(inputs)}")
        self._signature.check_flat(inputs)
        return execute(self.compiler, inputs)

    def report(self) -> ExecutionReport:
        """How the most recent call ran: paths per node, planned and dynamic bytes, the plan."""
        if self._latest is not None:
            return self._latest.report()
        return latest_report(self.compiler, self.name)

    def verify(self, *args: Any, **kwargs: Any) -> Any:
        """Run once with every slot poisoned at the end of its buffer's lifetime (and the whole
        arena before the first node) and compare the outputs with the unplanned graph's
        (``torch.testing.assert_close``); also check that no op moved or reshaped a slot.
        Returns the planned outputs; raises :class:`PlanVerificationError`."""
        try:
            program = self.program_for(*args, **kwargs)
            return verify_call(program.compiler, program._reference, args, kwargs)
        finally:
            give_back(self.compiler)

    def trace_allocations(self, *args: Any, **kwargs: Any) -> tuple[Any, AllocatorTrace]:
        """Run once annotated and return the result and what torch's allocator did meanwhile,
        charged to node paths (:mod:`~tensorarena.runtime.measure`; the arena never shows).
        Run a call first so the shape is planned."""
        try:
            return traced_call(self.program_for(*args, **kwargs).compiler, args, kwargs)
        finally:
            give_back(self.compiler)

    def record_memory(self, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Run once and return the result and the call's memory as a PyTorch memory snapshot
        (:mod:`~tensorarena.runtime.recording`; ``tensorarena.report.timeline_from_snapshot``
        draws it, ``torch.cuda._memory_viz`` reads it). Profiled: not for timing."""
        from tensorarena.runtime.recording import record_call

        try:
            return record_call(self.program_for(*args, **kwargs).compiler, args, kwargs)
        finally:
            give_back(self.compiler)

    @property
    def source(self) -> str:
        """The generated code of the most recent call's shape (for debugging)."""
        if self._latest is not None:
            return self._latest.source
        last = self.compiler.last
        return last.generated.source if last is not None else ""

    def __repr__(self) -> str:
        variants = f", exported_again={len(self._variants)}" if self._variants else ""
        return (f"PlannedProgram({self.name!r}, shapes_cached={len(self.compiler.cache)}, "
                f"plans_made={self.plans_made}{variants}, workspace={self.workspace.nbytes} bytes)")
