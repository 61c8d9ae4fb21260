"""A planning problem built from a computation graph, and the liveness bookkeeping behind it.

The front ends (:mod:`~tensorarena.planning.torch_frontend`,
:mod:`~tensorarena.planning.onnx_frontend`) walk a graph in execution order and report three kinds
of facts to a :class:`Liveness`: a node *produces* a tensor with its own storage (a buffer to plan,
or a tensor that lives outside the plan: a parameter, a module buffer, a constant, a graph input),
a node produces a tensor that *aliases* one seen before (a view, an in-place result), and a node
*uses* tensors. Time is the node index in the graph, so a buffer produced by node ``i`` and last
used, directly or through any alias, by node ``j`` lives during ``[i, j + 1)``; graph outputs live
to ``steps``, one past the last node.

Aliases always resolve to their root on the spot, so chains (a view of a view of an in-place
result) cost nothing to follow later.

Each planned buffer may carry a :class:`TensorSpec` (shape, strides, storage offset, dtype): what a
runtime needs to lay a tensor over the buffer's bytes (see :mod:`tensorarena.runtime`). It is plain
data, like the rest: dtypes are names (``"float32"``), so nothing here needs torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tensorarena.errors import InvalidProblemError
from tensorarena.planning.problem import Buffer, Problem

__all__ = ["GraphProblem", "Liveness", "TensorSpec"]

#: The kinds of tensors that are not planned (their storage is owned by someone else).
UNPLANNED_KINDS = ("parameter", "buffer", "constant", "input")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """The layout of a tensor over a buffer: ``shape``, ``stride`` and ``storage_offset`` in
    elements, ``dtype`` a torch dtype name without the prefix (``"float32"``, ``"bfloat16"``),
    ``itemsize`` its bytes per element."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    itemsize: int
    storage_offset: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes of storage the tensor spans: ``(offset + 1 + Σ (size - 1) × |stride|) × itemsize``
        (0 for a tensor with no elements)."""
        if any(size == 0 for size in self.shape):
            return 0
        extent = self.storage_offset + 1
        pairs = zip(self.shape, self.stride, strict=True)
        extent += sum((size - 1) * abs(stride) for size, stride in pairs)
        return extent * self.itemsize


@dataclass(frozen=True)
class GraphProblem:
    """A :class:`Problem` from a graph, with what was left out of it and why.

    ``unplanned`` maps each tensor that lives outside the plan (parameters, module buffers,
    constants, graph inputs, ONNX initializers) to its size in bytes, and ``unplanned_kinds`` to
    its kind (one of ``"parameter"``, ``"buffer"``, ``"constant"``, ``"input"``). ``aliases`` maps
    every tensor that shares the storage of another (views, in-place results, multi-output
    selections) to the root it shares: a buffer id or an unplanned name. ``outputs`` are the
    buffer ids that are graph outputs (they live to ``steps``, the number of time steps).
    ``tensors`` maps planned buffer ids to the layout of the tensor that fills them, where the
    front end knows it (the PyTorch front end always does).
    """

    problem: Problem
    unplanned: dict[str, int] = field(default_factory=dict)
    unplanned_kinds: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    steps: int = 0
    tensors: dict[str, TensorSpec] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The problem's name."""
        return self.problem.name

    @property
    def planned_bytes(self) -> int:
        """Sum of the planned buffers' sizes: the footprint with no reuse at all."""
        return sum(b.nbytes for b in self.problem.buffers)

    @property
    def unplanned_bytes(self) -> int:
        """Sum of the sizes of everything left out of the plan."""
        return sum(self.unplanned.values())

    def unplanned_bytes_of(self, kind: str) -> int:
        """Sum of the sizes of the unplanned tensors of one kind (e.g. ``"parameter"``)."""
        return sum(
            nbytes for name, nbytes in self.unplanned.items() if self.unplanned_kinds[name] == kind
        )

    def lower_bound(self) -> int:
        """The peak of live planned bytes; no plan of ``problem`` is lower."""
        return self.problem.lower_bound()

    def __repr__(self) -> str:
        return (
            f"GraphProblem({self.name!r}, buffers={len(self.problem)}, steps={self.steps}, "
            f"planned_bytes={self.planned_bytes}, lower_bound={self.lower_bound()}, "
            f"unplanned={len(self.unplanned)} ({self.unplanned_bytes} bytes), "
            f"aliases={len(self.aliases)})"
        )


class Liveness:
    """Collects produce / alias / use facts in node order and builds a :class:`GraphProblem`.

    Tensor names are the keys: every produced or aliased tensor gets a unique name, and
    :meth:`root` says which storage it lives in.
    """

    def __init__(self) -> None:
        self._root: dict[str, str] = {}  # tensor name -> root name
        self._start: dict[str, int] = {}  # planned root -> producing step
        self._end: dict[str, int] = {}  # planned root -> one past its last use
        self._nbytes: dict[str, int] = {}  # planned root -> size
        self._unplanned: dict[str, int] = {}
        self._kinds: dict[str, str] = {}
        self._aliases: dict[str, str] = {}
        self._outputs: dict[str, None] = {}  # ordered set
        self._specs: dict[str, TensorSpec] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._root

    def root(self, name: str) -> str:
        """The root (buffer id or unplanned name) whose storage ``name`` lives in."""
        return self._root[name]

    def is_planned(self, name: str) -> bool:
        """True if ``name`` lives in a planned buffer."""
        return self._root[name] in self._start

    def produce(self, name: str, step: int, nbytes: int, spec: TensorSpec | None = None) -> None:
        """A node at ``step`` creates ``name`` in fresh storage of ``nbytes`` bytes: plan it
        (``spec``, when known, is the layout of the tensor over those bytes)."""
        self._check_new(name)
        if spec is not None:
            self._specs[name] = spec
        self._root[name] = name
        self._start[name] = step
        self._end[name] = step + 1
        self._nbytes[name] = nbytes

    def external(self, name: str, nbytes: int, kind: str) -> None:
        """``name`` lives outside the plan (a parameter, a module buffer, a constant, an input)."""
        if kind not in UNPLANNED_KINDS:
            raise ValueError(f"unknown kind {kind!r}; expected one of {UNPLANNED_KINDS}")
        self._check_new(name)
        self._root[name] = name
        self._unplanned[name] = nbytes
        self._kinds[name] = kind

    def alias(self, name: str, base: str, step: int) -> None:
        """A node at ``step`` makes ``name`` share the storage of ``base`` (a view, an in-place
        result): no new buffer, and the base's root lives at least as long as ``name``."""
        self._check_new(name)
        root = self._root[base]
        self._root[name] = root
        self._aliases[name] = root
        self.use(name, step)

    def use(self, name: str, step: int) -> None:
        """A node at ``step`` reads or writes ``name``: its root lives past ``step``."""
        root = self._root[name]
        if root in self._end and self._end[root] < step + 1:
            self._end[root] = step + 1

    def output(self, names: Iterable[str], steps: int) -> None:
        """``names`` are graph outputs: their roots live to ``steps`` (the end of the graph)."""
        for name in names:
            root = self._root[name]
            if root in self._end:
                self._end[root] = max(self._end[root], steps)
                self._outputs[root] = None

    def build(self, *, steps: int, name: str = "", alignment: int = 1) -> GraphProblem:
        """The :class:`GraphProblem`: one buffer per planned root, in production order."""
        buffers = [
            Buffer(root, self._start[root], self._end[root], self._nbytes[root], alignment)
            for root in self._start
        ]
        return GraphProblem(
            Problem(buffers, name=name),
            unplanned=dict(self._unplanned),
            unplanned_kinds=dict(self._kinds),
            aliases=dict(self._aliases),
            outputs=tuple(self._outputs),
            steps=steps,
            tensors=dict(self._specs),
        )

    def _check_new(self, name: str) -> None:
        if name in self._root:
            raise InvalidProblemError(f"tensor {name!r} is produced twice in the graph")
