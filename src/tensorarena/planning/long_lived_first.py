"""Long-lived buffers first: placement orders for large traces where greedy by size stays high.

Greedy by size places the largest buffers first, whatever their lifetimes. On real training
traces that leaves the long-lived buffers (weights, optimizer state, activations saved for the
backward pass) for later, and each one must then find a gap free during its whole lifetime; there
is none, so they stack on top of the highest short-lived buffer they meet. On the idealloc traces
this is what keeps greedy by size above the lower bound (``bench/RESULTS.md``): the
top of the plan is a staircase of long-lived buffers and the small ones above them.

The orders here place every buffer that lives at least a given fraction of the trace's time span
first, by birth (earlier first; on ties the later death, then the larger size): born in sequence
and dying late, they pile up from the bottom the way a stack allocator would put them. The other
buffers follow by size, as in greedy by size, into the gaps the stack leaves. Every order is
placed with the heuristics' best-fit rule (:func:`~tensorarena.planning.heuristics.place`).

No single fraction is best: pangu_2.6B wants only the longest-lived buffers first, S_1 and
G_1 more of them, resnet50 all of them in birth order (``bench/RESULTS.md``).
:func:`long_lived_first` therefore sweeps :data:`FRACTIONS`, one placement each (a fraction that
selects the same buffers as the one before is skipped), and keeps the lowest plan. It stops at a
plan within the relative ``gap`` of the alignment-aware bound, at one within ``target`` bytes, or
when the next placement would not end within ``time_limit`` (estimated by the longest placement so
far; the first always runs). It is a stage of ``auto``, between the portfolio and the exact search.
"""

from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt

from tensorarena.errors import InvalidArgumentError
from tensorarena.planning.bounds import aligned_lower_bound, good_enough
from tensorarena.planning.heuristics import PlacementArrays, place
from tensorarena.planning.options import check_capacity, check_gap, check_time_limit
from tensorarena.planning.problem import Plan, PlanStatistics, Problem, lower_bound
from tensorarena.sizes import Size

__all__ = ["FRACTIONS", "long_lived_first", "long_lived_order"]

Int64Array = npt.NDArray[np.int64]

#: Fractions of the time span swept, in this order: a buffer living at least ``fraction`` times
#: the span is placed first (1.0: only those live throughout; 0.0: every buffer, by birth).
FRACTIONS: tuple[float, ...] = (1.0, 0.3, 0.1, 0.0, 0.5, 0.2, 0.05)


def long_lived_order(arrays: PlacementArrays, fraction: float) -> Int64Array:
    """The buffers living at least ``fraction`` of the span by birth, then the rest by size.

    Long-lived ties: later death first, then larger size. The rest go by size descending, and
    buffers of one size by birth, then later death (not greedy by size's longer lifetime first:
    equal buffers born in sequence then stack in order; on pangu_2.6B that tie-break alone is
    1.0334 -> 1.0076 x the bound). Input order last.
    """
    if arrays.n == 0:
        return np.zeros(0, np.int64)
    span = int(arrays.end.max() - arrays.start.min())
    long_lived = arrays.end - arrays.start >= fraction * span
    index = np.arange(arrays.n)
    short_size = np.where(long_lived, 0, -arrays.size)
    long_size = np.where(long_lived, -arrays.size, 0)
    keys = (index, long_size, -arrays.end, arrays.start, short_size, ~long_lived)
    return np.lexsort(keys).astype(np.int64)


def long_lived_first(problem: Problem, *, alignment: int | None = None, gap: float = 0.0,
                     target: Size | None = None, time_limit: float = math.inf,
                     initial: Plan | None = None) -> Plan:
    """The lowest plan over the long-lived-first orders of :data:`FRACTIONS` (see the module).

    ``initial`` (say the portfolio's plan) is returned unless an order beats it; its name then
    stays. The plan's ``planner`` is ``"long_lived_first:<fraction>"`` for an order that won.
    Stops early at a plan within ``gap`` of the bound or at most ``target`` bytes high, and
    before a placement that would not end within ``time_limit`` seconds.
    """
    arrays = PlacementArrays(problem, alignment)
    if initial is not None and (not isinstance(initial, Plan) or (
            initial.problem is not problem and initial.problem != problem)):
        raise InvalidArgumentError(
            f"initial must be a Plan of this problem, got {type(initial).__name__}"
            + (f" of problem {initial.problem.name!r}" if isinstance(initial, Plan) else "")
        )
    gap = check_gap(gap)
    stop = check_capacity(target, name="target")
    limit = check_time_limit(time_limit)
    bound = aligned_lower_bound(problem, arrays.alignment)
    best_name = "" if initial is None else initial.planner
    best_offsets: Int64Array | None = None
    best_height = math.inf if initial is None else initial.height
    longest = 0.0
    seen: set[bytes] = set()

    def done() -> bool:
        return best_height <= bound or good_enough(int(best_height), bound, gap) or (
            stop is not None and best_height <= stop)

    if arrays.n:
        life = arrays.end - arrays.start
        span = int(arrays.end.max() - arrays.start.min())
        for fraction in FRACTIONS:
            if math.isfinite(best_height) and done():
                break
            elapsed = time.perf_counter() - arrays.started
            if best_offsets is not None and elapsed + longest > limit:
                break
            selected = np.packbits(life >= fraction * span).tobytes()
            if selected in seen:
                continue  # the same buffers first: the same order
            seen.add(selected)
            began = time.perf_counter()
            offsets = place(arrays, long_lived_order(arrays, fraction), best_fit=True)
            longest = max(longest, time.perf_counter() - began)
            height = int((offsets + arrays.size).max(initial=0))
            if height < best_height:
                best_name = f"long_lived_first:{fraction:g}"
                best_offsets, best_height = offsets, height
    if best_offsets is None:
        if initial is not None:
            return initial
        best_offsets = np.zeros(0, np.int64)
        best_name = "long_lived_first"
    height = int((best_offsets + arrays.size).max(initial=0))
    statistics = PlanStatistics(seconds=time.perf_counter() - arrays.started,
                                lower_bound=lower_bound(problem), bound=bound)
    return Plan(problem, tuple(best_offsets.tolist()), planner=best_name,
                optimal=height <= bound, statistics=statistics)
