"""What a planned program did with each node and each byte: :class:`ExecutionReport`, which
:func:`execution_report` builds from one shape's
:class:`~tensorarena.runtime.specialization.Specialization` (:func:`latest_report`: the latest
call's)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.problem import lower_bound
from tensorarena.runtime.kernel_arena import KERNEL_TAG
from tensorarena.runtime.lowering import PATHS, NodePath
from tensorarena.runtime.output_placement import persistent_bytes
from tensorarena.sizes import format_size

if TYPE_CHECKING:
    from tensorarena.runtime.compiler import Compiler
    from tensorarena.runtime.shapes import ShapeBinder
    from tensorarena.runtime.specialization import Specialization

__all__ = ["ExecutionReport", "execution_report", "latest_report"]


@dataclass(frozen=True)
class ExecutionReport:
    """One shape of a planned program.

    ``nodes``: the path of every op node and why (see :mod:`tensorarena.runtime.lowering`);
    ``dynamic``: buffers left out of the plan, with the reason. Bytes: ``planned_bytes`` is the
    arena the plan needs (its height), ``lower_bound`` the peak of live planned bytes (no plan of
    the same buffers is lower), ``naive_bytes`` their sum (no reuse), ``dynamic_bytes`` the sum of
    the buffers left out, ``graph_lower_bound`` the lower bound of every buffer of the graph,
    planned or not. ``buffers`` counts the graph's planned buffers; the plan also holds
    ``kernel_buffers`` allocations kernels make inside a node (``kernel_bytes`` in all),
    planned where ``kernel_arena`` is ``"on"``
    (:mod:`~tensorarena.runtime.kernel_arena`; otherwise it says why not); ``kernel_served``
    and ``kernel_forwarded`` count the allocations of armed nodes served from the arena and
    forwarded to torch's allocator over every call so far, ``kernel_escaped`` the served ones
    that outlived their node (their nodes are no longer armed). With ``outputs="handover"``,
    ``tail_bytes`` of ``planned_bytes`` are the tail each call takes and hands over with its
    outputs (:mod:`~tensorarena.runtime.output_tail`); 0 otherwise.
    """

    name: str
    nodes: tuple[NodePath, ...]
    dynamic: dict[str, str]
    buffers: int
    lower_bound: int
    planned_bytes: int
    naive_bytes: int
    dynamic_bytes: int
    graph_lower_bound: int
    planner: str
    optimal: bool
    shapes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    kernel_arena: str = "off"
    kernel_buffers: int = 0
    kernel_bytes: int = 0
    kernel_served: int = 0
    kernel_forwarded: int = 0
    kernel_escaped: int = 0
    tail_bytes: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """Nodes per path, every path listed (zero included), in :data:`PATHS` order."""
        tally: Counter[str] = Counter(node.path for node in self.nodes)
        return {path: tally.get(path, 0) for path in PATHS}

    @property
    def reasons(self) -> dict[str, dict[str, int]]:
        """Per path, how many nodes took it for each reason."""
        out: dict[str, dict[str, int]] = {}
        for node in self.nodes:
            # Reasons that name an op (``written in place by aten::mm.out``) are grouped.
            reason = node.reason.split(" by ")[0] if node.path == "out" else node.reason
            bucket = out.setdefault(node.path, {})
            bucket[reason] = bucket.get(reason, 0) + 1
        return out

    @property
    def ratio(self) -> float:
        """``planned_bytes / lower_bound`` (1.0 for an empty plan)."""
        return self.planned_bytes / self.lower_bound if self.lower_bound else 1.0

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON: everything but the per-node list, plus counts and reasons."""
        return {
            "name": self.name,
            "counts": self.counts,
            "reasons": self.reasons,
            "buffers": self.buffers,
            "dynamic_buffers": len(self.dynamic),
            "lower_bound": self.lower_bound,
            "planned_bytes": self.planned_bytes,
            "naive_bytes": self.naive_bytes,
            "dynamic_bytes": self.dynamic_bytes,
            "graph_lower_bound": self.graph_lower_bound,
            "planner": self.planner,
            "optimal": self.optimal,
            "shapes": {str(k): v for k, v in self.shapes.items()},
            "seconds": self.seconds,
            "kernel_arena": self.kernel_arena,
            "kernel_buffers": self.kernel_buffers,
            "kernel_bytes": self.kernel_bytes,
            "kernel_served": self.kernel_served,
            "kernel_forwarded": self.kernel_forwarded,
            "kernel_escaped": self.kernel_escaped,
            "tail_bytes": self.tail_bytes,
        }

    def __str__(self) -> str:
        lines = [
            f"{self.name}: {self.buffers} planned buffers in {format_size(self.planned_bytes)} "
            f"(lower bound {format_size(self.lower_bound)}, x{self.ratio:.3f}; no reuse "
            f"{format_size(self.naive_bytes)}); {len(self.dynamic)} left out "
            f"({format_size(self.dynamic_bytes)}); planner {self.planner}",
        ]
        if self.kernel_arena != "off":
            lines.append(
                f"  kernels' own allocations: {self.kernel_arena}; {self.kernel_buffers} planned "
                f"({format_size(self.kernel_bytes)}), {self.kernel_served} served from the arena, "
                f"{self.kernel_forwarded} forwarded to torch, {self.kernel_escaped} escaped")
        if self.shapes:
            lines.append("  shapes: " + ", ".join(f"{k}={v}" for k, v in self.shapes.items()))
        for path, count in self.counts.items():
            if count:
                why = "; ".join(f"{n} {reason}" for reason, n in self.reasons[path].items())
                lines.append(f"  {path:<8}{count:>5}  {why}")
        return "\n".join(lines)


def execution_report(name: str, current: Specialization, binder: ShapeBinder, *,
                     tail_bytes: int = 0) -> ExecutionReport:
    """The report of one shape of the program ``name``, its size symbols named by ``binder``;
    ``tail_bytes``: its handed-over tail's size."""
    graph, lowering, plan = current.graph, current.lowering, current.plan
    sizes = {b.id: b.nbytes for b in graph.problem.buffers}
    kernel = [b for b in plan.problem.buffers if KERNEL_TAG in b.id]
    served, forwarded, escaped = current.scripts.counters() if current.scripts else (0, 0, 0)
    shapes = {binder.labels.get(s, str(s)): v for s, v in current.bindings.items()}
    return ExecutionReport(
        name=name,
        nodes=tuple(lowering.paths.values()),
        dynamic=dict(lowering.dynamic),
        buffers=len(plan.problem) - len(kernel),
        lower_bound=lower_bound(plan.problem),
        planned_bytes=plan.height,
        naive_bytes=sum(b.nbytes for b in plan.problem.buffers),
        dynamic_bytes=sum(sizes.get(b, 0) for b in lowering.dynamic),
        graph_lower_bound=graph.lower_bound(),
        planner=plan.planner + (f" ({current.planner_note})" if current.planner_note else ""),
        optimal=plan.optimal,
        shapes=shapes,
        seconds=current.seconds,
        kernel_arena=str(current.kernel_note),
        kernel_buffers=len(kernel),
        kernel_bytes=sum(b.nbytes for b in kernel),
        kernel_served=served,
        kernel_forwarded=forwarded,
        kernel_escaped=escaped,
        tail_bytes=tail_bytes,
    )


def latest_report(compiler: Compiler, name: str) -> ExecutionReport:
    """The report of the latest call of the program ``name`` whose state is ``compiler``;
    :class:`~tensorarena.errors.InvalidArgumentError` before its first call."""
    last = compiler.last
    if last is None:
        raise InvalidArgumentError("the program has not run yet: call it once first")
    tail = last.plan.height - persistent_bytes(compiler, last.plan, last.graph.outputs)
    return execution_report(name, last, compiler.binder, tail_bytes=tail)
