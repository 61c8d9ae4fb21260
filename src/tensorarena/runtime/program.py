"""``PlannedProgram``: a PyTorch graph run node by node, every intermediate at its planned offset.

Built from a ``torch.export`` program (:meth:`PlannedProgram.from_exported`) or an FX graph with
shapes (:meth:`PlannedProgram.from_graph_module`: ``make_fx``, ``aot_autograd``). For each input
shape it plans the buffers that can live in the arena, reserves the plan's height in its
:class:`~tensorarena.runtime.workspace.Workspace`, generates straight-line code that writes each
result into its slot (:mod:`~tensorarena.runtime.shape_plans`,
:mod:`~tensorarena.runtime.shape_code`) and caches the result (a
:class:`~tensorarena.runtime.specialization.Specialization`), up to ``max_plans`` shapes (least
recently used first out), as ONNX Runtime caches its memory patterns. ``max_shapes`` plans once
for declared maximum sizes instead and serves every smaller shape inside that plan (each buffer
at the same offset, never larger); ``growing`` names dimensions that change at every call (a
growing KV cache): their buffers are allocated per call from the dynamic pool and never trigger
a new plan. Where the outputs live: :mod:`~tensorarena.runtime.output_placement`.

**Threads.** A call holds the workspace for its whole duration; a second thread waits
(``concurrency="serialize"``) or is refused (``"refuse"``), never interleaved.

The program holds its options and a :class:`~tensorarena.runtime.compiler.Compiler`, the state
the stages below share (shapes cached, the order running, nodes demoted); a call is
:func:`~tensorarena.runtime.execute.execute`. None of the stages imports this module.

Elsewhere: where the graph comes from (:mod:`~tensorarena.runtime.graph_sources`), the graph
reordered before anything is planned (:mod:`~tensorarena.runtime.reordering`) and the program's
own copy of it with its rewrites (:mod:`~tensorarena.runtime.run_graph`), kernels' own
allocations recorded at a shape's first call and served from the arena
(:mod:`~tensorarena.runtime.kernel_recording`), the order chosen again with them
(:mod:`~tensorarena.runtime.kernel_order`), the report of a shape
(:mod:`~tensorarena.runtime.report`), :meth:`~PlannedProgram.verify`'s poisoned run
(:mod:`~tensorarena.runtime.verification`) and :meth:`~PlannedProgram.record_memory`'s snapshot
(:mod:`~tensorarena.runtime.recording`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from tensorarena.errors import (
    ExportFailedError,
    InvalidArgumentError,
    PlanVerificationError,
    ShapeNotCoveredError,
)
from tensorarena.interop.empty_cache import trim_c_heap
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.runtime import graph_sources
from tensorarena.runtime.compiler import Compiler
from tensorarena.runtime.device import CPU, graph_device
from tensorarena.runtime.execute import execute
from tensorarena.runtime.lowering import Unplaceable
from tensorarena.runtime.measure import AllocatorTrace
from tensorarena.runtime.one_off import give_back, traced_call
from tensorarena.runtime.options import (
    DEFAULT_TIME_LIMIT,
    ProgramOptions,
    check_example,
    workspace_for,
)
from tensorarena.runtime.output_placement import OutputPlacement, persistent_bytes
from tensorarena.runtime.report import ExecutionReport, execution_report
from tensorarena.runtime.signature import Signature
from tensorarena.runtime.variants import Variants, exported_again
from tensorarena.runtime.verification import verify_call
from tensorarena.runtime.workspace import Concurrency, Workspace

if TYPE_CHECKING:
    import torch
    import torch.fx

    from tensorarena.memory.resource import MemoryResource

__all__ = ["ExportFailedError", "OutputPlacement", "PlanVerificationError", "PlannedProgram"]

class PlannedProgram:
    """A graph run in one planned arena; call it like the program it was built from.

    Calls run under ``torch.no_grad()``: outputs carry no autograd history, even from inputs
    that require grad (the first such call of an exported program warns,
    :class:`~tensorarena.errors.NoGradWarning`; an ATen graph's inputs may by design; for
    gradients: :class:`~tensorarena.runtime.TrainingStep`, or
    ``torch.compile(model, backend="tensorarena")``).

    A call must be laid out as the example it was built with (the same positional arguments,
    the same keywords), each tensor of the dtype and on the device built with; every other
    argument (an int, a float, a flag, a string, ``None``, in containers too) is baked into the
    graph, and a call with another value is served by a program exported again for it
    (:meth:`from_module`) or refused (:class:`~tensorarena.errors.ShapeNotCoveredError`, the
    other constructors). Never run silently with the values built with.

    Use :meth:`from_exported`, :meth:`from_module` or :meth:`from_graph_module`. Options
    (keyword-only):

    ``resource``
        where the arena's block comes from (default: tensorarena's default resource; for a
        graph on ``cuda:N``, that device's pool ``device_pool(N)``: the arena lives on the
        graph's device, :attr:`device`, see :mod:`~tensorarena.runtime.device`; not with
        ``workspace``, whose resource it is);
    ``workspace``
        a :class:`Workspace` to share with other programs that never run at the same time
        (default: one of its own over ``resource``);
    ``pool``
        the resource of the dynamic pool (buffers of growing dimensions);
    ``planner``, ``time_limit``
        passed to :func:`tensorarena.planning.plan`;
    ``unplaceable``
        ``"copy"`` (default): a result of an op without an out variant is copied into its
        slot, so every planned byte lives in the arena; ``"dynamic"``: it stays where the op
        put it, outside the plan; ``"auto"``: dynamic when read for at most a few steps (its
        copy would be read once or twice), copied otherwise. None wins on every model: see
        ``tensorarena bench exec --unplaceable``;
    ``reorder``
        run the nodes in the order :func:`tensorarena.planning.reorder` chooses (memory-aware
        operator reordering: lower peaks of live bytes, so smaller arenas), searched for up to
        ``time_limit`` seconds on the example shapes before anything else; the order chosen is
        :attr:`schedule`, and it runs (:attr:`reordered`) unless it would raise the lower bound
        of the buffers planned here (reorder also counts the outputs, which the arena leaves
        out; ``"always"`` runs it regardless, to compare orders). Every order it returns keeps
        data dependencies, in-place accesses and random ops in their original order, so outputs
        are those of the graph as given (default off). With ``True`` and the kernel arena, the
        first recorded call chooses again with its kernels' allocations counted (the traced
        order, this one, or one searched anew: :mod:`~tensorarena.runtime.kernel_order`,
        :attr:`order_estimates`); every shape runs the order chosen then;
    ``outputs``
        ``"handover"`` (default): outputs are planned too, in a tail of the arena that each
        call hands over with them (a new one where the caller still holds the last call's
        outputs, so no call overwrites what a caller keeps), the rest held across calls: the
        peak is that of the arena with its outputs, as ONNX Runtime plans outputs with the
        rest (:mod:`~tensorarena.runtime.output_placement`); outputs whose size follows a
        ``growing`` dimension come from the dynamic pool. ``"fresh"``: outputs are made by
        torch at each call, on top of the arena; ``"arena"``: planned and returned as views of
        the whole arena, which the caller's outputs then hold (a call takes an arena none
        holds; the arena does not come from ``workspace``, which is then used for its lock
        only). :class:`~tensorarena.runtime.TrainingStep` defaults to ``"arena"``;
    ``inplace``
        run elementwise ops in place where their input dies (:mod:`~tensorarena.runtime.inplace`;
        default on; decided after reordering, on the order that runs);
    ``poison``
        overwrite each buffer when its lifetime ends (a debugging mode; see :meth:`verify`);
    ``max_plans``, ``max_shapes``, ``growing``
        dynamic shapes (see the module docstring);
    ``concurrency``
        ``"serialize"`` or ``"refuse"`` concurrent calls; default (``None``): the workspace's
        when one is given, else ``"serialize"``. A value that contradicts the given
        workspace's is refused (its lock is the one calls take);
    ``kernel_arena``
        serve the allocations kernels make inside a node (layer norm's copies, attention's
        result, im2col columns) from the arena too (:mod:`~tensorarena.runtime.kernel_arena`:
        a C++ shim compiled on first use; the first call of each shape records them, then the
        shape is planned again with them). ``"all"``: every one, the arena grows where they
        need more bytes than it has idle; ``"idle"``: only where the arena keeps the height it
        has without them (the others stay torch's); ``True`` (default): ``"all"`` with
        ``outputs="arena"``; otherwise whichever of the two gives the lower peak of
        the arena plus torch's allocations (outputs made on top of an arena held whole for
        the call can make ``"all"`` the higher); ``False``: none. Where the shim
        cannot be built, on a GPU or with ``max_shapes`` the program runs without it and
        :meth:`report` says why.
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        problem_of: Callable[[torch.fx.Graph, Mapping[Any, int]], GraphProblem],
        signature: Signature,
        *,
        name: str = "",
        reference: Callable[..., Any] | None = None,
        ranges: Mapping[Any, tuple[int | None, int | None]] | None = None,
        resource: MemoryResource | None = None,
        workspace: Workspace | None = None,
        pool: MemoryResource | None = None,
        planner: str = "auto",
        time_limit: float = DEFAULT_TIME_LIMIT,
        unplaceable: Unplaceable = "copy",
        reorder: bool | Literal["always"] = False,
        outputs: OutputPlacement = "handover",
        inplace: bool = True,
        poison: bool = False,
        max_plans: int = 8,
        max_shapes: Mapping[str, Sequence[int]] | None = None,
        growing: Iterable[str] = (),
        concurrency: Concurrency | None = None,
        kernel_arena: bool | Literal["all", "idle"] = True,
    ) -> None:
        options = ProgramOptions(
            resource=resource, pool=pool, planner=planner, time_limit=time_limit,
            unplaceable=unplaceable, reorder=reorder, outputs=outputs, inplace=inplace,
            poison=poison, max_plans=max_plans, max_shapes=max_shapes, growing=growing,
            concurrency=concurrency, kernel_arena=kernel_arena)  # checked: a wrong one raises
        self.name = name
        #: where outputs live: ``"handover"`` (planned in a tail handed over at each call),
        #: ``"fresh"`` (torch's, at each call) or ``"arena"`` (planned in the arena)
        self.outputs: OutputPlacement = outputs
        #: where the arena lives: the graph's device (:mod:`~tensorarena.runtime.device`)
        self.device = graph_device(gm.graph)
        self.workspace = workspace_for(workspace, resource, self.device, concurrency)
        #: the state the stages share while the program runs (shapes cached, order, demoted)
        self.compiler = Compiler(gm, problem_of, signature, options, device=self.device,
                                 workspace=self.workspace, ranges=ranges)
        self._signature = signature
        self._reference = reference
        #: programs exported again for other non-tensor values (from_module only)
        self._variants: Variants | None = None
        #: the program that served the latest call, where it was one of ``_variants``
        self._latest: PlannedProgram | None = None
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
        """``reorder=True``: the order is chosen again with the first recorded call's kernel
        allocations (:mod:`~tensorarena.runtime.kernel_order`); its estimates, by candidate."""
        return self.compiler.order_estimates

    @property
    def plans_made(self) -> int:
        """How many plans were computed (one per new shape without ``max_shapes``)."""
        return self.compiler.plans_made

    @property
    def contiguous_operands(self) -> tuple[str, ...]:
        """Matrix products whose broadcast operand is first copied into a planned buffer
        (:mod:`~tensorarena.runtime.operands`)."""
        return self.compiler.run.contiguous_operands

    @property
    def inplace_nodes(self) -> tuple[str, ...]:
        """Nodes rewritten to run in place."""
        return self.compiler.run.inplace_nodes

    # ------------------------------------------------------------------------------------------
    # Construction
    # ------------------------------------------------------------------------------------------

    @classmethod
    def from_exported(cls, ep: torch.export.ExportedProgram, **options: Any) -> PlannedProgram:
        """Plan and run an ``ExportedProgram``; call the result as ``ep.module()`` is called.
        Its non-tensor arguments are those exported with: a call with another value raises
        :class:`~tensorarena.errors.ShapeNotCoveredError` naming it (as ``ep.module()`` fails
        its guard), since there is no module here to export again."""
        return cls._from(graph_sources.from_exported(ep, options.pop("name", "")), options)

    @classmethod
    def from_module(
        cls,
        model: torch.nn.Module,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        dynamic_shapes: Any = None,
        strict: bool = False,
        **options: Any,
    ) -> PlannedProgram:
        """Export ``model`` with ``torch.export.export`` (under ``no_grad``, in the mode it is
        in: call ``model.eval()`` first for inference) and plan the program. A model that cannot
        be exported raises :class:`ExportFailedError` carrying torch's error.

        A call whose non-tensor arguments (``n=5``, ``flag=False``) differ from the example's
        exports ``model`` again with them (as it is then: weights, mode) and plans that graph
        in this program's workspace, kept like a shape's plan (up to ``max_plans`` sets of
        values); :meth:`report` and :attr:`source` then describe the program that served the
        latest call, :meth:`program_for` returns it, :attr:`plans_made` counts this one's."""
        check_example(args, kwargs)
        ep = graph_sources.export_module(model, args, kwargs or {},
                                         dynamic_shapes=dynamic_shapes, strict=strict)
        options.setdefault("name", type(model).__name__)
        program = cls.from_exported(ep, **options)
        layout = program._signature.layout
        if layout is not None and layout.baked:
            program._variants = exported_again(
                model, cls.from_exported, layout, options, program.workspace,
                dynamic_shapes=dynamic_shapes, strict=strict)
        return program

    @classmethod
    def from_graph_module(
        cls,
        gm: torch.fx.GraphModule,
        *,
        input_names: Sequence[str] | None = None,
        check_inputs: bool = True,
        **options: Any,
    ) -> PlannedProgram:
        """Plan and run an FX ``GraphModule`` whose nodes carry shapes (``make_fx``, export,
        dynamo, ``aot_autograd``); call the result with the graph's placeholders in order.
        ``check_inputs=False`` skips the shape checks (for callers that guard already). A
        non-tensor placeholder is passed as given: ``make_fx`` bakes the values it traced with
        into the graph and records none a call could be checked against (export the module, or
        use :meth:`from_module`, to have them guarded)."""
        source = graph_sources.from_graph_module(
            gm, options.pop("name", ""), input_names=input_names, check_inputs=check_inputs,
            signature=options.pop("signature", None))
        options.setdefault("reference", gm)
        return cls._from(source, options)

    @classmethod
    def _from(cls, source: graph_sources.GraphSource, options: dict[str, Any]) -> PlannedProgram:
        program = cls(source.gm, source.problem_of, source.signature,
                      **{**source.options, **options})
        if program.device == CPU:
            # An export and its planning free most of what they allocate, in many small
            # pieces glibc keeps resident (Llama 125M: 17 MiB): give the free pages back.
            trim_c_heap()
        return program

    # ------------------------------------------------------------------------------------------
    # Calling
    # ------------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            inputs = self._signature.flatten(args, kwargs)
        except ShapeNotCoveredError:  # a non-tensor argument other than the graph's
            other = self._other(args, kwargs)
            if other is None:
                raise
            self._latest = other
            return other(*args, **kwargs)
        self._latest = None
        return self._signature.unflatten(self._execute(inputs), inputs)

    def program_for(self, *args: Any, **kwargs: Any) -> PlannedProgram:
        """The program that serves a call with these arguments: this one, or (:meth:`from_module`)
        the one exported again for their non-tensor values (made now if new). Raises as a call
        would where none can serve them."""
        try:
            self._signature.flatten(args, kwargs)
        except ShapeNotCoveredError:
            other = self._other(args, kwargs)
            if other is None:
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
                f"(parameters and buffers included), got {len(inputs)}"
            )
        self._signature.check_flat(inputs)
        return self._execute(inputs)

    def _execute(self, inputs: list[Any]) -> Any:
        return execute(self.compiler, inputs)

    # ------------------------------------------------------------------------------------------
    # Reports and checks
    # ------------------------------------------------------------------------------------------

    def report(self) -> ExecutionReport:
        """How the most recent call ran: paths per node, planned and dynamic bytes, the plan."""
        if self._latest is not None:
            return self._latest.report()
        last = self.compiler.last
        if last is None:
            raise InvalidArgumentError("the program has not run yet: call it once first")
        tail = last.plan.height - persistent_bytes(self.compiler, last.plan, last.graph.outputs)
        return execution_report(self.name, last, self.compiler.binder, tail_bytes=tail)

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
        """Run once with every node annotated and return the result and what torch's allocator
        did meanwhile, charged to node paths (:mod:`~tensorarena.runtime.measure`). The arena is
        tensorarena memory and never shows; neither does making the code (the steady state is
        measured). Run a call first so the shape is planned."""
        program = self.program_for(*args, **kwargs)
        try:
            return traced_call(program.compiler, args, kwargs)
        finally:
            give_back(self.compiler)

    def record_memory(self, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Run once and return the result and the call's memory as a PyTorch memory snapshot
        (``dict``): every planned buffer at its place in the arena over its lifetime, the
        dynamic pool's blocks and torch's own allocations (:mod:`~tensorarena.runtime.recording`;
        ``tensorarena.report.timeline_from_snapshot`` draws it, ``torch.cuda._memory_viz``
        reads it). Profiled: not for timing."""
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
        return (
            f"PlannedProgram({self.name!r}, shapes_cached={len(self.compiler.cache)}, "
            f"plans_made={self.plans_made}{variants}, workspace={self.workspace.nbytes} bytes)"
        )

