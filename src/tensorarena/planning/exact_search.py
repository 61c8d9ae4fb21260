"""The decision search of the exact planner: does every buffer fit below a capacity?

A depth-first branch and bound over *canonical* placements, after minimalloc (M. D. Moffitt,
ASPLOS 2023). Any plan can be pushed down until no buffer can move lower; listed by offset, every
buffer of such a compact plan then sits at its *lowest offset*: the aligned top of the highest
buffer already placed that shares time with it (0 if none). So the search only ever chooses *which*
buffer comes next, never where. Each technique is a switch of
:class:`~tensorarena.planning.exact_params.SolverParams` and a method of the same name in
:mod:`~tensorarena.planning.exact_node`; why each is sound:

- ``canonical_only``: placements come in non-decreasing (offset, preorder rank) order, which
  enumerates each compact plan once;
- ``check_dominance``: a buffer may not go at or above the lowest top any unplaced buffer could
  reach, since that buffer would then fit entirely in the space below and the plan would not be
  compact;
- ``section_inference``: once a buffer sits at ``offset``, every later one sits at ``offset`` or
  higher, so in every section the unplaced live bytes must fit between ``offset`` and the
  capacity; a candidate's sections and the rest of the window make up the whole window, so one
  maximum of the window checks every candidate at once;
- ``unallocated_floor``: nothing unplaced in a section can go below the lowest offset any of its
  unplaced buffers can reach, so the section's unplaced bytes must fit above that floor (checked
  first: about half of all nodes end here);
- ``dynamic_decomposition``: when the last unplaced buffer spanning a section boundary is placed,
  the two sides no longer interact and are solved one after the other, so a failure on one side
  does not make the search re-enumerate the other. With ``window_preordering`` each window split
  off this way sorts its buffers afresh, with "T" counting only the bytes still unplaced, as
  minimalloc's sub-problems do (this alone takes its challenging H and I from over 30 s to under
  1 s); the windows that exist from the start each get a round robin of their own
  (:meth:`Solver.solve`);
- ``static_preordering``: buffers ranked by the static preorders, tried round robin with node
  budgets that double each round (minimalloc's schedule);
- ``remember_failures`` and ``nogoods`` (ours, not minimalloc's): a state is the set of unplaced
  buffers and their lowest offsets; different orders of placing the same buffers often leave the
  same one. A failed state is remembered with its canonical bound; when that bound restricted
  nothing, the failure is a true nogood, which also condemns any state with the same unplaced
  buffers and lowest offsets at least as high, whatever the preorder.

Pinned buffers keep their offsets (:meth:`~tensorarena.planning.exact_node.Search.pinned_lows`):
a compact plan pushes only the free buffers down, and its listing by offset still has each free
one at its lowest offset and each pinned one at its pin.

The sorted listing of every fully compact plan survives every cut above, which is all that
completeness needs. The node exists twice, one search in two engines (:data:`ENGINES`): NumPy
calls on arrays of a few hundred elements (:mod:`~tensorarena.planning.exact_node`, the pure
build's) and native loops over lists of ints that mypyc compiles
(:mod:`~tensorarena.planning.exact_lists`, several times cheaper a node, the compiled build's);
minimalloc's C++ node is cheaper still (per-node costs: bench/RESULTS.md). The search touches no
process-wide setting: it runs on a list, not on the
interpreter's stack.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning import exact_lists, exact_node
from tensorarena.planning.exact_lists import ListSearch
from tensorarena.planning.exact_node import Search, section_members
from tensorarena.planning.exact_params import Decision, SolverParams, Status
from tensorarena.planning.exact_sections import Sections
from tensorarena.planning.exact_work import node_budget

__all__ = ["ENGINES", "EXHAUSTED", "FOUND", "STOPPED", "Decision", "Solver", "SolverParams",
           "Status", "decide"]

FOUND, EXHAUSTED, STOPPED = Status.FOUND, Status.EXHAUSTED, Status.STOPPED

IntArray = npt.NDArray[np.int64]

#: The two implementations of the node: ``"numpy"`` (:class:`~tensorarena.planning.exact_node.
#: Search`, fast interpreted) and ``"lists"`` (:class:`~tensorarena.planning.exact_lists.
#: ListSearch`, fast compiled). Both visit the same nodes and find the same plans.
ENGINES = ("numpy", "lists")
_STATUS = {exact_lists.FOUND: FOUND, exact_lists.EXHAUSTED: EXHAUSTED,
           exact_lists.STOPPED: STOPPED}


def decide(
    sections: Sections,
    capacity: int,
    *,
    deadline: float = float("inf"),
    params: SolverParams | None = None,
    node_limit: int | None = None,
    work_limit: int | None = None,
    on_tick: Callable[[int], None] | None = None,
) -> Decision:
    """Search for offsets that fit every buffer in ``sections`` below ``capacity``.

    Shorthand for ``Solver(params).solve(...)``; see :meth:`Solver.solve`.
    """
    return Solver(params).solve(sections, capacity, deadline=deadline, node_limit=node_limit,
                                work_limit=work_limit, on_tick=on_tick)


class Solver:
    """The decision search with a set of techniques (:class:`SolverParams`).

    ``engine`` picks the node's implementation (:data:`ENGINES`); by default the list engine
    when it runs compiled (mypyc), NumPy's otherwise. Problems whose section table is too
    large always take NumPy's. The engine changes the speed, never the
    nodes visited or the answer.
    """

    def __init__(self, params: SolverParams | None = None, *, engine: str | None = None) -> None:
        if engine is not None and engine not in ENGINES:
            raise InvalidArgumentError(f"engine must be one of {ENGINES} or None, got {engine!r}")
        self.params = SolverParams() if params is None else params
        self.engine = engine

    def __repr__(self) -> str:
        off = [name for name in SolverParams.switches() if not getattr(self.params, name)]
        return f"Solver(off={off}, preorders={self.params.preorders})"

    def solve(
        self,
        sections: Sections,
        capacity: int,
        *,
        deadline: float = float("inf"),
        node_limit: int | None = None,
        work_limit: int | None = None,
        on_tick: Callable[[int], None] | None = None,
    ) -> Decision:
        """Search for offsets that fit every buffer in ``sections`` below ``capacity``.

        Several static preorders are tried round robin with a node budget that doubles each
        round (minimalloc's schedule), so one unlucky order does not sink the search; each
        independent time window (between zero cuts) has a schedule of its own. Stops at
        ``deadline`` (a ``time.monotonic()`` value) with STOPPED, and after ``node_limit``
        nodes in all (a budget that, unlike the clock, stops at the same place on any machine),
        or after ``work_limit`` work units (:func:`~tensorarena.planning.exact_work.node_work`
        a node), whichever allows fewer nodes.
        ``on_tick`` is called with the nodes visited so far at every look at the clock.
        """
        params = self.params
        n = len(sections)
        node_limit = node_budget(node_limit, work_limit, sections)
        if n == 0:
            return Decision(FOUND, np.zeros(0, dtype=np.int64), 0)
        if int(sections.total.max()) > capacity:
            return Decision(EXHAUSTED, None, 0)
        if int((sections.pin + sections.size)[sections.pin >= 0].max(initial=0)) > capacity:
            return Decision(EXHAUSTED, None, 0)  # a pin reaches past the capacity
        preorders = params.preorders if params.static_preordering else ("",)
        ranks = [sections.preorder_rank(h) if h else np.arange(n, dtype=np.int64)
                 for h in preorders]
        # Failed states stay failed across the restarts of one preorder (same capacity, rank).
        # (Keyed by digests in NumPy's engine, by hashes in the list engine's.)
        caches: list[dict[Any, int]] = [{} for _ in ranks]
        # True nogoods hold whatever the order: all preorders share them.
        nogoods: dict[Any, Any] = {}
        stored = [0]  # lowest offsets held in ``nogoods``, against _NOGOOD_CELLS
        searches: list[Search | ListSearch | None] = [None] * len(ranks)  # built when needed
        spent = [0]  # nodes of the runs already finished, for on_tick
        tick = None if on_tick is None else (lambda k: on_tick(spent[0] + k))
        lists = self._lists(sections)

        def search(k: int) -> Search | ListSearch:
            built = searches[k]
            if built is None:
                if lists is not None:
                    built = lists.search(capacity, ranks[k], preorders[k], deadline, caches[k],
                                         nogoods, stored, tick)
                else:
                    built = Search(params, sections, capacity, ranks[k], preorders[k],
                                   deadline, caches[k], nogoods, stored, tick)
                searches[k] = built
            return built

        # Windows between zero cuts share no buffer: each gets its own round robin, so a window
        # solved once stays solved while another needs more restarts (one schedule over all of
        # them would solve the easy ones again at every restart, and only under the same order).
        decompose = params.dynamic_decomposition
        cutpoints = (np.flatnonzero(sections.cuts == 0) + 1).tolist() if decompose else []
        bounds = [0, *cutpoints, sections.n_sections]
        offsets = np.zeros(n, dtype=np.int64)
        nodes = 0
        for lo, hi in pairwise(bounds):
            inside = (sections.first < hi) & (sections.last > lo)
            count = int(inside.sum())
            if not count:
                continue
            if time.monotonic() > deadline:  # many small windows may never reach a clock check
                return Decision(STOPPED, None, nodes, timed_out=True)
            budget = count
            solved = None
            while solved is None:
                budget *= 2
                for k in range(len(ranks)):
                    limit = budget if len(ranks) > 1 else None
                    left = None if node_limit is None else node_limit - nodes
                    if left is not None and left <= 0:
                        return Decision(STOPPED, None, nodes)
                    current = search(k)
                    if isinstance(current, ListSearch):
                        status = _STATUS[current.run(np.flatnonzero(inside).tolist(), lo, hi,
                                                     -1 if limit is None else limit,
                                                     -1 if left is None else left)]
                    else:
                        status = current.run(inside, lo, hi, limit, left)
                    nodes += current.nodes
                    spent[0] = nodes
                    if status is FOUND:
                        solved = current
                        break
                    if status is EXHAUSTED:
                        return Decision(EXHAUSTED, None, nodes)
                    if current.timed_out:
                        return Decision(STOPPED, None, nodes, timed_out=True)
            offsets[inside] = np.asarray(solved.offsets, dtype=np.int64)[inside]
        return Decision(FOUND, offsets, nodes)

    def engine_for(self, sections: Sections) -> str:
        """The engine (:data:`ENGINES`) that :meth:`solve` runs on these sections."""
        return "numpy" if self._lists(sections) is None else "lists"

    def _lists(self, sections: Sections) -> _ListInputs | None:
        """The list engine's inputs when it is the one to run, else None."""
        if self.engine == "numpy" or (self.engine is None and not exact_lists.compiled()):
            return None
        table = section_members(sections)
        if table is None:
            return None
        return _ListInputs(self.params, sections, table)


class _ListInputs:
    """What every :class:`ListSearch` of one decision shares, as lists, built once."""

    def __init__(self, params: SolverParams, sections: Sections,
                 table: tuple[npt.NDArray[np.int32], IntArray]) -> None:
        self.switches = (params.canonical_only, params.section_inference,
                         params.check_dominance, params.unallocated_floor,
                         params.dynamic_decomposition, params.window_preordering,
                         params.remember_failures, params.nogoods)
        self.sections = sections
        self.size: list[int] = sections.size.tolist()
        self.align: list[int] = sections.align.tolist()
        self.first: list[int] = sections.first.tolist()
        self.last: list[int] = sections.last.tolist()
        self.width: list[int] = sections.width.tolist()
        self.overlaps: list[list[int]] = [ov.tolist() for ov in sections.overlaps]
        self.by_section: list[int] = table[0].tolist()
        self.section_start: list[int] = table[1].tolist()
        self.pin: list[int] = sections.pin.tolist()

    def search(self, capacity: int, rank: IntArray, heuristic: str, deadline: float,
               failed: dict[int, int], nogoods: dict[int, tuple[int, ...]],
               stored: list[int], tick: Callable[[int], None] | None) -> ListSearch:
        """A fresh search under one preorder (its own copies of the state it changes)."""
        sec = self.sections
        limits = (exact_node.CLOCK_EVERY, exact_node.CLOCK_WORK, exact_node.GROUP_LIMIT,
                  exact_node.MEMORY_LIMIT, exact_node.NOGOOD_CELLS)
        return ListSearch(self.switches, capacity, self.size, self.align, self.first, self.last,
                          self.width, self.overlaps, sec.total.tolist(), sec.cuts.tolist(),
                          self.by_section, self.section_start, rank.tolist(), heuristic,
                          deadline, failed, nogoods, stored, tick, limits, self.pin)
