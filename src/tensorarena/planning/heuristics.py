"""Heuristic static planners: naive, greedy by size (best and first fit), greedy by breadth, and
the best-fit heap simulation.

Every greedy here is the same two-step recipe: an *order* in which buffers are placed, then a
*placement rule* applied to each buffer in turn. The rule looks only at the already-placed
buffers that overlap the new one in time, walks the gaps between them from the bottom of the
arena up, and takes either the smallest gap that fits (best fit: TFLite's
``GreedyBySizeAssignment``, XLA's ``GlobalDecreasingSizeBestFitHeap``) or the lowest one (first
fit: TFLite Micro's ``GreedyMemoryPlanner``). When no gap fits, the buffer goes on top of the
highest time-overlapping buffer (not of the whole arena: lower stacks elsewhere in time stay low).

Pinned buffers (``Buffer.offset``) are placed first, at their offsets, whatever the order: to the
rule they are occupied rectangles like any placed buffer, so every greedy honours them.

Speed. The real traces have tens of thousands of buffers, thousands of them overlapping any one
in time, so a per-pair Python loop is out of the question. The placed buffers are kept in NumPy
arrays sorted by offset; placing a buffer is a constant number of vectorised passes (a time
mask, a running maximum of tops, a comparison) and one sorted insertion, i.e.
O(n) element operations in C per buffer and no per-pair Python. On the 62k-buffer idealloc
Y_1 trace one greedy takes a few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidProblemError
from tensorarena.planning.bounds import aligned_lower_bound, distinct, good_enough
from tensorarena.planning.options import check_capacity, check_gap, check_int64, check_problem
from tensorarena.planning.problem import Plan, PlanStatistics, Problem, lower_bound
from tensorarena.sizes import Size, check_alignment

__all__ = [
    "HEURISTICS",
    "PlacementArrays",
    "breadth_order",
    "greedy_breadth",
    "greedy_size",
    "greedy_size_first_fit",
    "heap_best_fit",
    "naive",
    "place",
    "portfolio",
    "size_order",
    "spatial_order",
    "temporal_order",
]

Int64Array = npt.NDArray[np.int64]


# ---------------------------------------------------------------------------------------------
# Problem → arrays
# ---------------------------------------------------------------------------------------------


class PlacementArrays:
    """Starts, ends, sizes and alignments of a problem as int64 arrays (global alignment folded
    in). Every heuristic starts by making these, so they also hold its start time and checked
    arguments."""

    __slots__ = ("align", "alignment", "end", "n", "pin", "size", "start", "started")

    def __init__(self, problem: Problem, alignment: int | None) -> None:
        self.started = time.perf_counter()
        buffers = check_problem(problem).buffers
        self.n = len(buffers)
        extra = 1 if alignment is None else check_alignment(alignment)
        self.alignment = extra
        check_int64(problem, extra)
        self.start: Int64Array = np.fromiter((b.start for b in buffers), np.int64, self.n)
        self.end: Int64Array = np.fromiter((b.end for b in buffers), np.int64, self.n)
        self.size: Int64Array = np.fromiter((b.nbytes for b in buffers), np.int64, self.n)
        self.align: Int64Array = np.fromiter(
            (max(b.alignment, extra) for b in buffers), np.int64, self.n
        )
        #: a pinned buffer's offset, -1 for a free one
        self.pin: Int64Array = np.fromiter(
            (-1 if b.offset is None else b.offset for b in buffers), np.int64, self.n
        )
        if extra > 1 and bool(((self.pin > 0) & (self.pin % extra != 0)).any()):
            bad = next(b for b in buffers if b.offset is not None and b.offset % extra)
            raise InvalidProblemError(
                f"buffer {bad.id!r}: pinned offset {bad.offset} is not a multiple of the "
                f"alignment {extra} asked for",
                column="offset",
            )


# ---------------------------------------------------------------------------------------------
# Orders
# ---------------------------------------------------------------------------------------------


def size_order(arrays: PlacementArrays) -> Int64Array:
    """Size descending, ties to the longer lifetime, then input order (TFLite's greedy by size)."""
    index = np.arange(arrays.n)
    return np.lexsort((index, -(arrays.end - arrays.start), -arrays.size)).astype(np.int64)


def spatial_order(arrays: PlacementArrays) -> Int64Array:
    """XLA's spatial order: size descending, then longer lifetime, then buffer id.

    That is exactly TFLite's size order (:func:`size_order`); the portfolio places it once.
    """
    return size_order(arrays)


def temporal_order(arrays: PlacementArrays) -> Int64Array:
    """XLA's temporal order: longer lifetime first, then larger size, then buffer id."""
    index = np.arange(arrays.n)
    return np.lexsort((index, -arrays.size, -(arrays.end - arrays.start))).astype(np.int64)


def breadth_order(arrays: PlacementArrays) -> Int64Array:
    """TFLite's greedy by breadth, as an order.

    Time steps are processed by decreasing *breadth* (live bytes at that step; ties to the
    earlier step), and at each step its not-yet-placed buffers by decreasing size. A buffer is
    therefore placed at the highest-ranked step of its lifetime: a range-minimum query over the
    step ranks, answered for all buffers at once with a sparse table.
    """
    n = arrays.n
    if n == 0:
        return np.zeros(0, np.int64)
    ticks = distinct(np.concatenate((arrays.start, arrays.end)))
    first = np.searchsorted(ticks, arrays.start)
    stop = np.searchsorted(ticks, arrays.end)  # exclusive: lifetimes are half-open
    diff = np.zeros(len(ticks) + 1, np.int64)
    np.add.at(diff, first, arrays.size)
    np.add.at(diff, stop, -arrays.size)
    breadth = np.cumsum(diff)[: len(ticks)]
    step_order = np.lexsort((np.arange(len(ticks)), -breadth))
    rank = np.empty(len(ticks), np.int64)
    rank[step_order] = np.arange(len(ticks))
    # Sparse table: table[k][t] = min(rank[t : t + 2**k]).
    table = [rank]
    width = 1
    while 2 * width <= len(ticks):
        prev = table[-1]
        table.append(np.minimum(prev[:-width], prev[width:]))
        width *= 2
    length = stop - first  # >= 1 since end > start
    level = np.floor(np.log2(length)).astype(np.int64)
    # log2 of exact powers of two can round down by one ulp; repair both ways.
    level[(1 << (level + 1)) <= length] += 1
    level[(1 << level) > length] -= 1
    step = np.empty(n, np.int64)
    for k in distinct(level).tolist():
        members = np.flatnonzero(level == k)
        row = table[k]
        step[members] = np.minimum(row[first[members]], row[stop[members] - (1 << k)])
    index = np.arange(n)
    return np.lexsort(
        (index, -(arrays.end - arrays.start), -arrays.size, step)
    ).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------------------------


def place(arrays: PlacementArrays, order: Int64Array, *, best_fit: bool) -> Int64Array:
    """Place buffers in ``order``, pinned ones first at their offsets; return the offsets
    (indexed like ``arrays``)."""
    n = arrays.n
    pins = arrays.pin.tolist()
    pinned = np.flatnonzero(arrays.pin >= 0)
    if len(pinned):
        order = np.concatenate([pinned, order[arrays.pin[order] < 0]])
    offsets = np.zeros(n, np.int64)
    # The placed buffers, sorted by offset (ties: insertion order).
    p_off = np.empty(n, np.int64)
    p_top = np.empty(n, np.int64)
    p_start = np.empty(n, np.int64)
    p_end = np.empty(n, np.int64)
    # Preallocated masks: the per-buffer passes then allocate only O(overlap) arrays.
    mask = np.empty(n, np.bool_)
    scratch = np.empty(n, np.bool_)
    never = np.iinfo(np.int64).max
    placed = 0
    starts = arrays.start.tolist()
    ends = arrays.end.tolist()
    sizes = arrays.size.tolist()
    aligns = arrays.align.tolist()
    for i in order.tolist():
        start, end, size, align = starts[i], ends[i], sizes[i], aligns[i]
        if size == 0 and pins[i] < 0:
            # Offset 0 is valid for an empty buffer whatever else is there; keep it out of the
            # placed set so it never splits a gap.
            continue
        offset = 0
        if pins[i] >= 0:
            offset = pins[i]
        elif placed:
            live = mask[:placed]
            np.less(p_start[:placed], end, out=live)
            np.logical_and(live, np.greater(p_end[:placed], start, out=scratch[:placed]), out=live)
            near = np.flatnonzero(live)  # time-overlapping placed buffers, by offset
            if len(near):
                low = p_off[near]
                top = np.maximum.accumulate(p_top[near])
                floor = np.empty_like(top)  # highest top below each buffer: its gap's floor
                floor[0] = 0
                floor[1:] = top[:-1]
                gap = low - floor
                if align > 1:
                    begin = (floor + (align - 1)) & -align
                    fits = begin + size <= low
                else:
                    begin = floor
                    fits = gap >= size
                # Best fit: the smallest gap that fits; first fit: the lowest one.
                k = int(np.where(fits, gap, never).argmin() if best_fit else fits.argmax())
                # No gap fits: on top of the highest time-overlapping buffer.
                offset = int(begin[k]) if fits[k] else (int(top[-1]) + align - 1) & -align
        offsets[i] = offset
        pos = int(np.searchsorted(p_off[:placed], offset, "right"))
        if pos < placed:
            # Overlapping slice assignment: NumPy buffers it, so the shift is safe.
            p_off[pos + 1 : placed + 1] = p_off[pos:placed]
            p_top[pos + 1 : placed + 1] = p_top[pos:placed]
            p_start[pos + 1 : placed + 1] = p_start[pos:placed]
            p_end[pos + 1 : placed + 1] = p_end[pos:placed]
        p_off[pos] = offset
        p_top[pos] = offset + size
        p_start[pos] = start
        p_end[pos] = end
        placed += 1
    return offsets


def _height(arrays: PlacementArrays, offsets: Int64Array) -> int:
    return int((offsets + arrays.size).max(initial=0))


def _plan(problem: Problem, arrays: PlacementArrays, offsets: Int64Array, name: str,
          bound: int | None = None) -> Plan:
    if bound is None:
        bound = aligned_lower_bound(problem, arrays.alignment)
    # A plan at the (alignment-aware) lower bound cannot be beaten: say so, whatever found it.
    optimal = _height(arrays, offsets) <= bound
    statistics = PlanStatistics(seconds=time.perf_counter() - arrays.started,
                                lower_bound=lower_bound(problem), bound=bound)
    return Plan(problem, tuple(offsets.tolist()), planner=name, optimal=optimal,
                statistics=statistics)


# ---------------------------------------------------------------------------------------------
# Planners
# ---------------------------------------------------------------------------------------------


def naive(problem: Problem, *, alignment: int | None = None) -> Plan:
    """Every buffer its own bytes: offsets are the (aligned) prefix sums of the sizes."""
    arrays = PlacementArrays(problem, alignment)
    return _plan(problem, arrays, _naive_offsets(arrays), "naive")


def _naive_offsets(arrays: PlacementArrays) -> Int64Array:
    # Pinned buffers keep their offsets; the free ones are stacked above the highest pin.
    pinned = arrays.pin >= 0
    offsets = np.where(pinned, arrays.pin, 0)
    top = int((arrays.pin + arrays.size)[pinned].max(initial=0))
    pairs = zip(arrays.size.tolist(), arrays.align.tolist(), pinned.tolist(), strict=True)
    for i, (size, align, fixed) in enumerate(pairs):
        if fixed:
            continue
        top = (top + align - 1) & -align
        offsets[i] = top
        top += size
    return offsets


def greedy_size(problem: Problem, *, alignment: int | None = None) -> Plan:
    """TFLite's offset greedy by size: largest first (ties to the longer lifetime), each at the
    smallest gap that fits among time-overlapping placed buffers, else on top of them."""
    arrays = PlacementArrays(problem, alignment)
    return _plan(problem, arrays, place(arrays, size_order(arrays), best_fit=True), "greedy_size")


def greedy_size_first_fit(problem: Problem, *, alignment: int | None = None) -> Plan:
    """TFLite Micro's greedy planner: same order as :func:`greedy_size`, lowest gap that fits."""
    arrays = PlacementArrays(problem, alignment)
    offsets = place(arrays, size_order(arrays), best_fit=False)
    return _plan(problem, arrays, offsets, "greedy_size_first_fit")


def greedy_breadth(problem: Problem, *, alignment: int | None = None) -> Plan:
    """TFLite's greedy by breadth: widest time steps first, their buffers by size, best fit."""
    arrays = PlacementArrays(problem, alignment)
    offsets = place(arrays, breadth_order(arrays), best_fit=True)
    return _plan(problem, arrays, offsets, "greedy_breadth")


def heap_best_fit(problem: Problem, *, alignment: int | None = None) -> Plan:
    """XLA's ``GlobalDecreasingSizeBestFitHeap``: best fit in spatial (size) order and in
    temporal (lifetime) order; the lower of the two plans."""
    arrays = PlacementArrays(problem, alignment)
    best: Int64Array | None = None
    best_height = 0
    for order in (spatial_order(arrays), temporal_order(arrays)):
        offsets = place(arrays, order, best_fit=True)
        height = _height(arrays, offsets)
        if best is None or height < best_height:
            best, best_height = offsets, height
    assert best is not None
    return _plan(problem, arrays, best, "heap_best_fit")


def portfolio(problem: Problem, *, alignment: int | None = None, gap: float = 0.0,
              target: Size | None = None) -> Plan:
    """Run every heuristic above and keep the lowest plan (ties: the first in
    :data:`HEURISTICS` order). The plan's ``planner`` is ``"portfolio:<winner>"``.

    Orders that coincide (XLA's spatial order is TFLite's size order) are placed once. It stops
    early at a plan that nothing needs to beat: one at the alignment-aware lower bound, one
    within the relative ``gap`` of it, or (the decision question "does it fit?") one at or
    below ``target`` bytes.
    """
    arrays = PlacementArrays(problem, alignment)
    gap = check_gap(gap)
    stop = check_capacity(target, name="target")
    bound = aligned_lower_bound(problem, arrays.alignment)
    sizes = size_order(arrays)
    # XLA's spatial pass is greedy_size's placement, so heap_best_fit adds only its temporal one.
    candidates: list[tuple[str, Callable[[], Int64Array]]] = [
        ("greedy_size", lambda: place(arrays, sizes, best_fit=True)),
        ("greedy_breadth", lambda: place(arrays, breadth_order(arrays), best_fit=True)),
        ("heap_best_fit", lambda: place(arrays, temporal_order(arrays), best_fit=True)),
        ("greedy_size_first_fit", lambda: place(arrays, sizes, best_fit=False)),
    ]
    best_name, best_offsets = "naive", _naive_offsets(arrays)
    best_height = _height(arrays, best_offsets)
    for name, run in candidates:
        if best_height <= bound:
            break
        # The no-reuse layout may be close enough, or fit, but nobody wants it as the answer.
        if best_name != "naive" and (
            good_enough(best_height, bound, gap) or (stop is not None and best_height <= stop)
        ):
            break
        offsets = run()
        height = _height(arrays, offsets)
        if height < best_height:
            best_name, best_offsets, best_height = name, offsets, height
    return _plan(problem, arrays, best_offsets, f"portfolio:{best_name}", bound)


#: name → heuristic planner; every entry takes ``(problem, *, alignment=None)``.
HEURISTICS: dict[str, Callable[..., Plan]] = {
    "naive": naive,
    "greedy_size": greedy_size,
    "greedy_size_first_fit": greedy_size_first_fit,
    "greedy_breadth": greedy_breadth,
    "heap_best_fit": heap_best_fit,
    "portfolio": portfolio,
}
