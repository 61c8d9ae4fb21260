"""The options of a :class:`~tensorarena.runtime.PlannedProgram`, checked when it is made.

A wrong option must fail where it is written, before anything is planned, not at the first
call (a planner name, a time limit, a resource) or never (``reorder="sometimes"`` and
``inplace="no"`` are truthy). :class:`ProgramOptions` lists the options of how a program plans
and runs, with their defaults, for those that pass them on (the ``torch.compile`` backend).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tensorarena.errors import InvalidArgumentError, UnknownNameError
from tensorarena.memory.resource import check_resource
from tensorarena.planning.options import check_time_limit
from tensorarena.planning.planners import PLANNERS

if TYPE_CHECKING:
    from tensorarena.memory.resource import MemoryResource
    from tensorarena.runtime.lowering import Unplaceable
    from tensorarena.runtime.workspace import Concurrency, Workspace

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "OutputPlacement",
    "ProgramOptions",
    "check_example",
    "check_options",
    "concurrency_for",
    "workspace_for",
]

#: Seconds the exact search may spend on one shape's plan by default.
DEFAULT_TIME_LIMIT = 2.0

#: Where a program's outputs live: made by torch at each call, planned in the arena, or planned
#: in a tail of the arena handed over at each call (:mod:`~tensorarena.runtime.output_tail`).
OutputPlacement = Literal["fresh", "arena", "handover"]


def check_options(
    *,
    unplaceable: Any,
    outputs: Any,
    reorder: Any,
    inplace: Any,
    poison: Any,
    max_plans: Any,
    planner: Any,
    time_limit: Any,
    resource: Any,
    pool: Any,
    concurrency: Any = None,
    kernel_arena: Any = True,
    mkl_buffers: Any = True,
) -> None:
    """Raise :class:`~tensorarena.errors.InvalidArgumentError` (or a subclass) for the first
    option that is not one the program takes."""
    if unplaceable not in ("auto", "copy", "dynamic"):
        raise InvalidArgumentError(
            f"unplaceable must be 'auto', 'copy' or 'dynamic', got {unplaceable!r}"
        )
    if outputs not in ("fresh", "arena", "handover"):
        raise InvalidArgumentError(
            f"outputs must be 'fresh', 'arena' or 'handover', got {outputs!r}"
        )
    if not isinstance(reorder, bool) and reorder != "always":
        raise InvalidArgumentError(f"reorder must be True, False or 'always', got {reorder!r}")
    for name, value in (("inplace", inplace), ("poison", poison), ("mkl_buffers", mkl_buffers)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    if not isinstance(kernel_arena, bool) and kernel_arena not in ("all", "idle"):
        raise InvalidArgumentError(
            f"kernel_arena must be True, False, 'all' or 'idle', got {kernel_arena!r}"
        )
    if type(max_plans) is not int or max_plans < 1:
        raise InvalidArgumentError(f"max_plans must be a positive int, got {max_plans!r}")
    if not isinstance(planner, str) or planner not in PLANNERS:
        raise UnknownNameError(
            f"unknown planner {planner!r}; expected one of {', '.join(PLANNERS)}",
            kind="planner", name=planner, known=tuple(PLANNERS),
        )
    check_time_limit(time_limit)
    for name, value in (("resource", resource), ("pool", pool)):
        if value is not None:
            check_resource(value, name=name)
    if concurrency not in (None, "serialize", "refuse"):
        raise InvalidArgumentError(
            f"concurrency must be 'serialize' or 'refuse', got {concurrency!r}"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ProgramOptions:
    """How a :class:`~tensorarena.runtime.PlannedProgram` plans and runs: its keyword options
    but those that name it and its graph (``name``, ``reference``, ``ranges``) and its
    ``workspace``. Checked when made; the program, the training step and the ``torch.compile``
    backend take these and no others.

    ``resource``
        where the arena's block comes from (default: tensorarena's default resource; for a
        graph on ``cuda:N``, that device's pool ``device_pool(N)``: the arena lives on the
        graph's device, see :mod:`~tensorarena.runtime.device`; not with ``workspace``, whose
        resource it is);
    ``pool``
        the resource of the dynamic pool (buffers of ``growing`` dimensions);
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
        operator reordering: lower peaks of live bytes, so smaller arenas), searched on the
        example shapes before anything else with a budget of work steps, so the same order on
        any machine (``REORDER_TIME_LIMIT`` seconds at most); the order chosen is
        the program's ``schedule``, and it runs (``reordered``) unless it would raise the lower
        bound of the buffers planned here (reorder also counts the outputs, which the arena
        leaves out; ``"always"`` runs it regardless, to compare orders). Every order it returns
        keeps data dependencies, in-place accesses and random ops in their original order, so
        outputs are those of the graph as given (default off). With ``True`` and the kernel
        arena, the first recorded call chooses again with its kernels' allocations counted (the
        traced order, this one, or one searched anew: :mod:`~tensorarena.runtime.kernel_order`,
        ``order_estimates``); every shape runs the order chosen then;
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
        overwrite each buffer when its lifetime ends (a debugging mode; see the program's
        ``verify``);
    ``max_plans``
        how many input shapes keep their plan (least recently used first out), as ONNX Runtime
        caches its memory patterns;
    ``max_shapes``
        plan once for these maximum sizes (by input name) and serve every smaller shape inside
        that plan (each buffer at the same offset, never larger);
    ``growing``
        dimensions that change at every call (a growing KV cache): their buffers are allocated
        per call from the dynamic pool and never trigger a new plan;
    ``concurrency``
        a call holds the workspace for its whole duration; a second thread waits
        (``"serialize"``) or is refused (``"refuse"``), never interleaved. Default (``None``):
        the workspace's when one is given, else ``"serialize"``. A value that contradicts the
        given workspace's is refused (its lock is the one calls take);
    ``kernel_arena``
        serve the allocations kernels make inside a node (layer norm's copies, attention's
        result, im2col columns) from the arena too (:mod:`~tensorarena.runtime.kernel_arena`:
        a C++ shim compiled on first use; the first call of each shape records them, then the
        shape is planned again with them). ``"all"``: every one, the arena grows where they
        need more bytes than it has idle; ``"idle"``: only where the arena keeps the height it
        has without them (the others stay torch's); ``True`` (default): ``"all"`` with
        ``outputs="arena"``; otherwise whichever of the two gives the lower peak of the arena
        plus torch's allocations (outputs made on top of an arena held whole for the call can
        make ``"all"`` the higher); ``False``: none. Where the shim cannot be built, on a GPU
        or with ``max_shapes`` the program runs without it and its report says why;
    ``mkl_buffers``
        after the first call of each shape, leave MKL's memory manager with one GEMM packing
        buffer, its largest, where it kept several (:mod:`~tensorarena.interop.mkl_buffers`:
        it keeps them for the process, one per size that outgrew the ones before, and the
        largest serves every call; outputs are the same). Default on; nothing without MKL or
        with more than one intra-op thread (MKL keeps a cache per thread).
    """

    resource: MemoryResource | None = None
    pool: MemoryResource | None = None
    planner: str = "auto"
    time_limit: float = DEFAULT_TIME_LIMIT
    unplaceable: Unplaceable = "copy"
    reorder: bool | Literal["always"] = False
    outputs: OutputPlacement = "handover"
    inplace: bool = True
    poison: bool = False
    max_plans: int = 8
    max_shapes: Mapping[str, Sequence[int]] | None = None
    growing: Iterable[str] = ()
    concurrency: Concurrency | None = None
    kernel_arena: bool | Literal["all", "idle"] = True
    mkl_buffers: bool = True

    def __post_init__(self) -> None:
        check_options(
            unplaceable=self.unplaceable, outputs=self.outputs, reorder=self.reorder,
            inplace=self.inplace, poison=self.poison, max_plans=self.max_plans,
            planner=self.planner, time_limit=self.time_limit, resource=self.resource,
            pool=self.pool, concurrency=self.concurrency, kernel_arena=self.kernel_arena,
            mkl_buffers=self.mkl_buffers,
        )


def concurrency_for(concurrency: Concurrency | None, workspace: Workspace | None) -> Concurrency:
    """The concurrency a program runs with: ``concurrency`` if given, else the workspace's,
    else ``"serialize"``. A workspace brings its own (its lock is the one calls take), so an
    explicit value that contradicts it is refused rather than ignored."""
    if workspace is None:
        return "serialize" if concurrency is None else concurrency
    if concurrency is not None and concurrency != workspace.concurrency:
        raise InvalidArgumentError(
            f"concurrency={concurrency!r} contradicts the workspace given, which has "
            f"concurrency={workspace.concurrency!r}: calls take the workspace's lock, so leave "
            f"concurrency out or make the workspace with Workspace(concurrency={concurrency!r})"
        )
    return workspace.concurrency


def workspace_for(workspace: Any, resource: MemoryResource | None, device: str,
                  concurrency: Concurrency | None) -> Workspace:
    """The workspace of a program whose graph runs on ``device``: ``workspace``, checked (a
    :class:`Workspace` on that device, not given with a ``resource``, whose concurrency
    ``concurrency`` does not contradict), or a new one over ``resource``."""
    from tensorarena.runtime.workspace import Workspace

    if workspace is not None and not isinstance(workspace, Workspace):
        raise InvalidArgumentError(
            f"workspace must be a Workspace, got {type(workspace).__name__}"
        )
    if workspace is not None and resource is not None:
        raise InvalidArgumentError(
            "give resource or workspace, not both: a program given a workspace takes its "
            "memory from the workspace's resource (Workspace(resource))"
        )
    if workspace is not None and workspace.device != device:
        raise InvalidArgumentError(
            f"the graph runs on {device} but the workspace given is on {workspace.device}"
        )
    resolved = concurrency_for(concurrency, workspace)
    return workspace or Workspace(resource, concurrency=resolved, device=device)


def check_example(args: Any, kwargs: Any) -> None:
    """Raise :class:`~tensorarena.errors.InvalidArgumentError` unless ``args`` is a sequence
    of example inputs and ``kwargs`` a mapping or None: a tensor given for ``(x,)`` would be
    iterated row by row, each row taken for an argument."""
    if isinstance(args, str) or not isinstance(args, Sequence):
        raise InvalidArgumentError(
            f"args must be a tuple of example inputs, got {type(args).__name__}: "
            "write (x,) for one input"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidArgumentError(
            f"kwargs must be a dict of example inputs, got {type(kwargs).__name__}"
        )
