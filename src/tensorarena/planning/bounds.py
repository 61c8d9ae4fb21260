"""Lower bounds on the height of any plan, and the rule that says a plan is good enough.

The *peak* (:func:`~tensorarena.planning.problem.lower_bound`) counts live bytes. It ignores
alignment: when every offset is a multiple of 64, a 100-byte buffer below another one takes 128
bytes of the stack, so a plan can be optimal and still sit above the peak. A planner that only
stops at the peak then searches on for its whole time limit for a plan that cannot exist.

:func:`aligned_lower_bound` closes that gap. Let ``g`` be the smallest alignment of any non-empty
buffer (after the plan's own ``alignment``): every offset is a multiple of ``g``. Stack the
buffers live in one time section by offset; each one's successor starts at a multiple of ``g`` at
or above its end, so every buffer but the top one uses ``round_up(size, g)`` bytes of the height,
and the top one its size. Whichever is on top, the height is at least
``sum(round_up(size, g)) - max(padding)`` over the section's live buffers, where ``padding`` is
``round_up(size, g) - size``. The bound is the largest of these over all sections; with ``g == 1``
it is the peak.

:func:`good_enough` is the stopping rule every planner shares: a height at the bound is optimal,
and one within the relative ``gap`` of it (MIP solvers' ``mip_rel_gap``) is close enough to stop.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tensorarena.planning.problem import Problem, lower_bound

__all__ = ["DEFAULT_GAP", "aligned_lower_bound", "distinct", "gap_of", "good_enough"]

IntArray = npt.NDArray[np.int64]

#: Relative gap at which the planners stop by default: 0.01 % over the bound (the default of
#: HiGHS, Gurobi and CPLEX for ``mip_rel_gap``), a few bytes per megabyte.
DEFAULT_GAP = 1e-4


def aligned_lower_bound(problem: Problem, alignment: int | None = None) -> int:
    """The peak of live bytes with each buffer's alignment padding counted (see the module doc).

    ``alignment`` raises every buffer's alignment to at least this power of two, as
    :func:`~tensorarena.planning.plan` does. Never below :func:`lower_bound`.
    """
    buffers = [b for b in problem.buffers if b.nbytes > 0]
    if not buffers:
        return 0
    floor = alignment or 1
    g = min(max(b.alignment, floor) for b in buffers)
    if g == 1:
        return lower_bound(problem)
    starts = np.fromiter((b.start for b in buffers), np.int64, len(buffers))
    ends = np.fromiter((b.end for b in buffers), np.int64, len(buffers))
    sizes = np.fromiter((b.nbytes for b in buffers), np.int64, len(buffers))
    rounded = (sizes + (g - 1)) // g * g
    padding = rounded - sizes
    times = distinct(np.concatenate((starts, ends)))
    first = np.searchsorted(times, starts)
    last = np.searchsorted(times, ends)  # one past the last section
    n_sections = len(times) - 1
    diff = np.zeros(n_sections + 1, np.int64)
    np.add.at(diff, first, rounded)
    np.subtract.at(diff, last, rounded)
    stacked = np.cumsum(diff)[:n_sections]
    return max(int((stacked - _largest_live(first, last, padding, n_sections)).max()),
               lower_bound(problem))


def _largest_live(first: IntArray, last: IntArray, values: IntArray, n_sections: int) -> IntArray:
    """For every section, the largest ``values[i]`` among the buffers live in it (0 if none).

    Buffers are taken largest value first, and each paints the sections of its lifetime that
    no larger one painted; a "next unpainted section" table with path halving makes every
    section painted once, so the whole costs about one pass over buffers and sections.
    """
    result = np.zeros(n_sections, np.int64)
    following = list(range(n_sections + 1))  # following[k]: first unpainted section >= k

    def find(k: int) -> int:
        while following[k] != k:
            following[k] = following[following[k]]
            k = following[k]
        return k

    order = np.argsort(-values, kind="stable")
    for a, b, value in zip(first[order].tolist(), last[order].tolist(),
                           values[order].tolist(), strict=True):
        if value == 0:
            break
        k = find(a)
        while k < b:
            result[k] = value
            following[k] = k + 1
            k = find(k + 1)
    return result


def gap_of(height: int, bound: int) -> float:
    """``(height - bound) / bound``: how far a plan may be above the optimum (0 when proven)."""
    if height <= bound:
        return 0.0
    return (height - bound) / bound if bound else float("inf")


def good_enough(height: int, bound: int, gap: float) -> bool:
    """True when ``height`` is within the relative ``gap`` of the lower bound ``bound``."""
    return height <= bound or height - bound <= gap * bound


def distinct(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The distinct values, ascending: ``np.unique`` for one integer array, without the import of
    ``numpy.ma`` that ``np.unique`` costs on its first call in NumPy 2.4 (a noticeable part of
    every ``tensorarena plan`` process's start-up: bench/RESULTS.md)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), np.bool_)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
