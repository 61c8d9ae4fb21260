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

from tensorarena.errors import InvalidArgumentError, UnknownPlannerError
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
    for name, value in (("inplace", inplace), ("poison", poison)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    if not isinstance(kernel_arena, bool) and kernel_arena not in ("all", "idle"):
        raise InvalidArgumentError(
            f"kernel_arena must be True, False, 'all' or 'idle', got {kernel_arena!r}"
        )
    if type(max_plans) is not int or max_plans < 1:
        raise InvalidArgumentError(f"max_plans must be a positive int, got {max_plans!r}")
    if not isinstance(planner, str) or planner not in PLANNERS:
        raise UnknownPlannerError(
            f"unknown planner {planner!r}; expected one of {', '.join(PLANNERS)}"
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
    ``workspace``, with the same defaults (a test holds the two lists equal). Checked when
    made, as the program checks them."""

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

    def __post_init__(self) -> None:
        check_options(
            unplaceable=self.unplaceable, outputs=self.outputs, reorder=self.reorder,
            inplace=self.inplace, poison=self.poison, max_plans=self.max_plans,
            planner=self.planner, time_limit=self.time_limit, resource=self.resource,
            pool=self.pool, concurrency=self.concurrency, kernel_arena=self.kernel_arena,
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
