"""A graph's operators as plain data, for choosing the order they run in.

The order in which a graph's nodes run sets every lifetime, and so the lower bound itself. An
:class:`OpGraph` keeps what an order needs and nothing else: for every node, the nodes that must
run before it and the planned buffers it creates and uses; for every buffer, its size and
whether it is a graph output. :meth:`OpGraph.lifetimes` turns any valid order into the
``[start, end)`` of every buffer by the front ends' own rule (created at its producer's step,
alive through its last use, outputs to the end), so an order can be scored without rebuilding
anything, and :func:`check_order` is the independent check that an order keeps every dependency.

:func:`op_graph_from_fx` reads a ``torch.fx`` graph (from ``make_fx`` or ``torch.export``) after
the PyTorch front end has planned it, so that views, in-place results and multi-output nodes
resolve to the same buffers as in the front end's problem. Besides the data edges, an order
must keep: placeholders first and in their order, the output node last; every access to a tensor
that some node writes in place (``add_``, ``copy_``) in its original order (a read moved past a
write would read other bytes); and every impure or random node (dropout, ``rand``) in its
original order, so that a reordered graph draws the same random numbers and gives equal outputs.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning.graph_problem import GraphProblem

if TYPE_CHECKING:
    import torch.fx

__all__ = ["OpGraph", "check_order", "op_graph_from_fx", "reordered_graph", "with_node_buffers"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class OpGraph:
    """Nodes (by name, in their given order), their dependencies, the buffers they touch."""

    names: tuple[str, ...]  #: node names, in the order given
    preds: tuple[tuple[int, ...], ...]  #: nodes that must run before each node
    produces: tuple[tuple[int, ...], ...]  #: buffers each node creates
    uses: tuple[tuple[int, ...], ...]  #: buffers each node reads or writes (their roots)
    buffer_ids: tuple[str, ...]  #: the planned buffers, as in the front end's problem
    sizes: tuple[int, ...]  #: bytes of each buffer
    outputs: frozenset[int]  #: buffers that are graph outputs: alive to the end

    def __post_init__(self) -> None:
        n, m = len(self.names), len(self.buffer_ids)
        if not (len(self.preds) == len(self.produces) == len(self.uses) == n):
            raise InvalidProblemError("an OpGraph needs preds, produces and uses for every node")
        if len(self.sizes) != m:
            raise InvalidProblemError("an OpGraph needs one size per buffer")
        _check_fields(self)
        successors, topological = _check_acyclic(self.names, self.preds)
        object.__setattr__(self, "_successors", successors)
        object.__setattr__(self, "_topological", topological)
        producer = np.full(m, -1, np.int64)
        for v, made in enumerate(self.produces):
            for b in made:
                if producer[b] >= 0:
                    raise InvalidProblemError(f"buffer {self.buffer_ids[b]!r} is made twice")
                producer[b] = v
        if (producer < 0).any():
            lost = self.buffer_ids[int(np.flatnonzero(producer < 0)[0])]
            raise InvalidProblemError(f"buffer {lost!r} has no producing node")
        # CSR arrays of each buffer's users, for scoring an order in a few NumPy calls.
        users: list[list[int]] = [[] for _ in range(m)]
        for v, used in enumerate(self.uses):
            for b in used:
                users[b].append(v)
        for b in range(m):
            users[b].append(int(producer[b]))  # a buffer lives at least through its own step
        counts = np.array([len(u) for u in users], np.int64)
        object.__setattr__(self, "_producer", producer)
        object.__setattr__(self, "_users_flat",
                           np.array([v for u in users for v in u], np.int64))
        object.__setattr__(self, "_users_start",
                           np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64))
        object.__setattr__(self, "_size_array", np.array(self.sizes, np.int64))
        object.__setattr__(self, "_output_mask",
                           np.isin(np.arange(m), np.fromiter(self.outputs, np.int64)))
        object.__setattr__(self, "_users", tuple(tuple(u) for u in users))

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        edges = sum(len(p) for p in self.preds)
        return f"OpGraph(nodes={len(self.names)}, edges={edges}, buffers={len(self.buffer_ids)})"

    @property
    def producer(self) -> IntArray:
        """The node that creates each buffer."""
        return self._producer  # type: ignore[attr-defined, no-any-return]

    @property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """The nodes that depend on each node (the inverse of :attr:`preds`)."""
        return self._successors  # type: ignore[attr-defined, no-any-return]

    @property
    def topological_order(self) -> tuple[int, ...]:
        """One valid order (Kahn's, the one the acyclicity check found)."""
        return self._topological  # type: ignore[attr-defined, no-any-return]

    @property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """The nodes that use each buffer (its producer included)."""
        return self._users  # type: ignore[attr-defined, no-any-return]

    @property
    def size_array(self) -> IntArray:
        """:attr:`sizes` as an int64 array."""
        return self._size_array  # type: ignore[attr-defined, no-any-return]

    def lifetimes(self, order: Sequence[int] | IntArray) -> tuple[IntArray, IntArray]:
        """``(start, end)`` of every buffer when the nodes run in ``order`` (node indices)."""
        pos = np.empty(len(self.names), np.int64)
        pos[np.asarray(order, np.int64)] = np.arange(len(self.names), dtype=np.int64)
        start = pos[self._producer]  # type: ignore[attr-defined]
        if not len(start):
            return start, start.copy()
        end = np.maximum.reduceat(pos[self._users_flat], self._users_start) + 1  # type: ignore[attr-defined]
        end[self._output_mask] = len(self.names)  # type: ignore[attr-defined]
        return start, end

    def profile(self, order: Sequence[int] | IntArray) -> IntArray:
        """Live bytes at every step of ``order``."""
        start, end = self.lifetimes(order)
        diff = np.zeros(len(self.names) + 1, np.int64)
        np.add.at(diff, start, self.size_array)
        np.subtract.at(diff, end, self.size_array)
        return np.cumsum(diff)[:-1]

    def peak(self, order: Sequence[int] | IntArray) -> int:
        """The lower bound of the problem ``order`` makes: its peak of live bytes."""
        return int(self.profile(order).max(initial=0))


def with_node_buffers(graph: OpGraph, nbytes: Mapping[str, int]) -> OpGraph:
    """``graph`` with a buffer ``<node>#local`` of ``nbytes[node]`` bytes made and used by that
    node alone (live only while it runs): memory a node needs besides its inputs and outputs,
    such as a kernel's scratch, which then weighs on every order that runs the node where
    much else is live. Names that are not nodes of ``graph`` are refused; zero sizes add
    nothing."""
    if not isinstance(graph, OpGraph):
        raise InvalidArgumentError(
            f"with_node_buffers() takes an OpGraph, got {type(graph).__name__}")
    index = {name: v for v, name in enumerate(graph.names)}
    unknown = next((name for name in nbytes if name not in index), None)
    if unknown is not None:
        raise InvalidArgumentError(f"with_node_buffers(): {unknown!r} is not a node of the graph")
    produces = [list(made) for made in graph.produces]
    ids, sizes = list(graph.buffer_ids), list(graph.sizes)
    for name, size in nbytes.items():
        if type(size) is not int or size < 0:
            raise InvalidArgumentError(
                f"with_node_buffers(): {name!r} needs a non-negative int of bytes, got {size!r}")
        if size:
            produces[index[name]].append(len(ids))
            ids.append(f"{name}#local")
            sizes.append(size)
    return OpGraph(names=graph.names, preds=graph.preds,
                   produces=tuple(tuple(p) for p in produces), uses=graph.uses,
                   buffer_ids=tuple(ids), sizes=tuple(sizes), outputs=graph.outputs)


def _is_index(value: object, limit: int) -> bool:
    """An int (Python's or NumPy's, never a bool) in ``[0, limit)``."""
    return (isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            and 0 <= int(value) < limit)


def _check_fields(graph: OpGraph) -> None:
    """Refuse names that repeat, sizes that are not byte counts, and buffer indices that are not
    buffers (a negative one would silently index from the end of the NumPy arrays)."""
    m = len(graph.buffer_ids)
    for kind, names in (("node", graph.names), ("buffer", graph.buffer_ids)):
        seen: set[object] = set()
        for name in names:
            if not isinstance(name, str) or name in seen:
                raise InvalidProblemError(f"{kind} name {name!r} is not a str used once")
            seen.add(name)
    for b, size in enumerate(graph.sizes):
        if type(size) is not int or size < 0:
            raise InvalidProblemError(
                f"buffer {graph.buffer_ids[b]!r}: size must be a non-negative int, got {size!r}"
            )
    for role, lists in (("produces", graph.produces), ("uses", graph.uses)):
        for v, buffers in enumerate(lists):
            bad = next((b for b in buffers if not _is_index(b, m)), None)
            if bad is not None:
                raise InvalidProblemError(
                    f"node {graph.names[v]!r} {role} {bad!r}: not a buffer index (0 to {m - 1})",
                    column=graph.names[v],
                )
    bad = next((b for b in graph.outputs if not _is_index(b, m)), None)
    if bad is not None:
        raise InvalidProblemError(f"output {bad!r} is not a buffer index (0 to {m - 1})")


def _check_acyclic(names: Sequence[str], preds: Sequence[Sequence[int]]
                   ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Refuse dependencies with a cycle (Kahn's algorithm), naming a node on it; else every
    node's successors and the order Kahn's algorithm ran the nodes in."""
    n = len(names)
    waiting = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(preds):
        for p in ps:
            if not _is_index(p, n) or p == v:
                raise InvalidProblemError(f"node {names[v]!r} depends on {p!r}: not another node")
            succ[p].append(v)
    ready = [v for v in range(n) if waiting[v] == 0]
    order: list[int] = []
    while ready:
        v = ready.pop()
        order.append(v)
        for s in succ[v]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    if len(order) < n:
        stuck = next(v for v in range(n) if waiting[v] > 0)
        raise InvalidProblemError(f"the graph has a cycle: node {names[stuck]!r} can never run",
                                  column=names[stuck])
    return tuple(tuple(s) for s in succ), tuple(order)


def check_order(graph: OpGraph, order: Sequence[int]) -> None:
    """Refuse an order that is not a permutation of the nodes or breaks a dependency
    (:class:`InvalidArgumentError` naming the node)."""
    if not isinstance(graph, OpGraph):
        raise InvalidArgumentError(f"check_order() takes an OpGraph, got {type(graph).__name__}")
    if isinstance(order, (str, bytes)) or not isinstance(order, (Sequence, np.ndarray)):
        raise InvalidArgumentError(
            f"order must be a sequence of node indices, got {type(order).__name__}"
        )
    n = len(graph)
    ran_at = np.full(n, -1, np.int64)
    for step, v in enumerate(order):
        if not _is_index(v, n):
            raise InvalidArgumentError(f"order: step {step} is {v!r}, not a node (0 to {n - 1})")
        if ran_at[v] >= 0:
            raise InvalidArgumentError(
                f"order: node {graph.names[v]!r} runs twice (steps {ran_at[v]} and {step})"
            )
        for p in graph.preds[v]:
            if ran_at[p] < 0:
                raise InvalidArgumentError(
                    f"order: node {graph.names[v]!r} runs before {graph.names[p]!r}, which it "
                    "depends on"
                )
        ran_at[v] = step
    if len(order) != n:
        never = graph.names[int(np.flatnonzero(ran_at < 0)[0])]
        raise InvalidArgumentError(
            f"order: node {never!r} never runs ({len(order)} steps for {n} nodes)"
        )


# ---------------------------------------------------------------------------------------------
# From torch.fx
# ---------------------------------------------------------------------------------------------


def op_graph_from_fx(graph: torch.fx.Graph, problem: GraphProblem) -> OpGraph:
    """The :class:`OpGraph` of an fx graph whose front-end problem is ``problem``.

    ``problem`` must come from this very graph (``problem_from_fx`` or ``problem_from_exported``):
    its time steps are the graph's node indices. A graph with a cycle is refused.
    """
    from tensorarena.planning.torch_frontend import METADATA_ONLY_OPS
    from tensorarena.planning.torch_graph import op_name

    nodes = list(graph.nodes)
    index = {node.name: i for i, node in enumerate(nodes)}
    ids = {b.id: i for i, b in enumerate(problem.problem.buffers)}
    produces: list[list[int]] = [[] for _ in nodes]
    for b, buffer in enumerate(problem.problem.buffers):
        if not 0 <= buffer.start < len(nodes):
            raise InvalidProblemError(f"the problem does not come from this graph ({buffer.id!r})")
        produces[buffer.start].append(b)

    def root(name: str) -> str | None:
        if name in ids or name in problem.unplanned:
            return name
        return problem.aliases.get(name)

    def carried(node: Any) -> set[str]:
        names = [node.name]
        value = node.meta.get("val")
        if isinstance(value, (list, tuple)):
            names += [f"{node.name}.{k}" for k in range(len(value))]
            names += [u.name for u in node.users if u.target is operator.getitem]
        return {r for r in map(root, names) if r is not None}

    carriers = {node.name: carried(node) for node in nodes}
    preds: list[set[int]] = [set() for _ in nodes]
    roots_used: list[set[str]] = [set() for _ in nodes]
    for i, node in enumerate(nodes):
        picks = node.target is operator.getitem and node.args
        for arg in node.all_input_nodes:
            preds[i].add(index[arg.name])
            if (picks and arg is node.args[0]) or op_name(node) in METADATA_ONLY_OPS:
                continue
            roots_used[i] |= carriers[arg.name]
        if node.name in problem.aliases:
            roots_used[i] |= carriers[node.name]
    _keep_placeholders_and_output(nodes, preds)
    _keep_in_order((i for i, node in enumerate(nodes) if _is_impure(node)), preds)
    for written in _written_roots(nodes, carriers):
        _keep_in_order((i for i in range(len(nodes)) if written in roots_used[i]
                        or written in carriers[nodes[i].name]), preds)
    uses = [tuple(sorted(ids[r] for r in used if r in ids)) for used in roots_used]
    result = OpGraph(
        names=tuple(node.name for node in nodes),
        preds=tuple(tuple(sorted(p)) for p in preds),
        produces=tuple(tuple(p) for p in produces),
        uses=tuple(uses),
        buffer_ids=tuple(b.id for b in problem.problem.buffers),
        sizes=tuple(b.nbytes for b in problem.problem.buffers),
        outputs=frozenset(ids[o] for o in problem.outputs if o in ids),
    )
    check_order(result, list(range(len(nodes))))  # the given order must itself be valid
    return result


def _keep_placeholders_and_output(nodes: list[Any], preds: list[set[int]]) -> None:
    placeholders = [i for i, node in enumerate(nodes) if node.op == "placeholder"]
    _keep_in_order(placeholders, preds)
    if placeholders:
        last = placeholders[-1]
        for i, node in enumerate(nodes):
            if node.op != "placeholder":
                preds[i].add(last)
    for i, node in enumerate(nodes):
        if node.op == "output":
            preds[i] |= set(range(len(nodes))) - {i}


def _keep_in_order(members: Iterable[int], preds: list[set[int]]) -> None:
    previous = None
    for i in members:
        if previous is not None and previous != i:
            preds[i].add(previous)
        previous = i


def _is_impure(node: Any) -> bool:
    if node.op in ("placeholder", "output"):
        return False
    target = node.target
    tags = getattr(target, "tags", ())
    import torch

    if torch.Tag.nondeterministic_seeded in tags:
        return True
    try:
        return bool(node.is_impure())
    except Exception:  # an op fx cannot classify: keep it where it was
        return True


def _written_roots(nodes: list[Any], carriers: dict[str, set[str]]) -> set[str]:
    """Every tensor root that some node writes in place (``Tensor(a!)`` arguments)."""
    written: set[str] = set()
    for node in nodes:
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        for k, argument in enumerate(schema.arguments):
            info = argument.alias_info
            if info is None or not info.is_write:
                continue
            value = node.args[k] if k < len(node.args) else node.kwargs.get(argument.name)
            if hasattr(value, "name") and value.name in carriers:
                written |= carriers[value.name]
    return written


def reordered_graph(graph: torch.fx.Graph, order: Sequence[str]) -> torch.fx.Graph:
    """A copy of ``graph`` with its nodes in ``order`` (node names): same nodes, same meta, and
    the same calling convention (a ``make_fx`` graph's inputs and outputs (un)flatten as before)."""
    import torch.fx

    by_name = {node.name: node for node in graph.nodes}
    if sorted(order) != sorted(by_name):
        raise InvalidArgumentError("order must name every node of the graph exactly once")
    new = torch.fx.Graph(owning_module=graph.owning_module)
    new._codegen = graph._codegen
    env: dict[str, Any] = {}
    for name in order:
        node = by_name[name]
        missing = [a.name for a in node.all_input_nodes if a.name not in env]
        if missing:
            raise InvalidArgumentError(f"order runs {name!r} before {missing[0]!r}, its input")
        copy = new.node_copy(node, lambda n: env[n.name])
        copy.meta = dict(node.meta)
        env[name] = copy
    return new
