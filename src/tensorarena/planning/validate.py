"""An independent checker of plans, short enough to be obviously correct, and fast.

It shares no code with any planner. It sweeps time once, in order of events (ends before starts
at equal times: lifetimes are half-open), and keeps the buffers live at the current time sorted
by offset. Because those are pairwise disjoint in space (the sweep stops at the first clash), a
new buffer can only clash with its neighbours in that order: the live buffer with the highest
offset below its own (which has the highest end among those below, the stack being disjoint)
and the one with the lowest offset at or above it. Two bisections and two comparisons per
buffer: O(n log n) comparisons, plus the list insertions and removals (memory moves of the live
count), where the former pairwise check cost O(n × live) Python comparisons and took longer
than planning on the 62k-buffer traces.

Zero-byte buffers follow minimalloc's rule (``[o, o)`` clashes with ``[low, high)`` when
``low < o < high``): they are points, kept in a list of their own, and checked against the
interval stack and it against them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from tensorarena.errors import InvalidArgumentError, InvalidPlanError
from tensorarena.planning.options import check_capacity, check_problem
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.sizes import Size

__all__ = ["is_valid", "validate"]


def validate(problem: Problem, plan: Plan, *, capacity: Size | None = None) -> None:
    """Raise :class:`InvalidPlanError` naming the first violation; return if the plan is valid.

    Checks: one non-negative, aligned offset per buffer; every pinned buffer at its offset; no
    two buffers that are live at the same time share a byte; the height fits ``capacity`` (or
    ``problem.capacity``) if one is given.
    """
    buffers = check_problem(problem).buffers
    if not isinstance(plan, Plan):
        raise InvalidArgumentError(f"expected a Plan, got {type(plan).__name__}")
    capacity = check_capacity(capacity)
    offsets = plan.offsets
    if len(offsets) != len(buffers):
        raise InvalidPlanError(f"{len(offsets)} offsets for {len(buffers)} buffers")
    for buffer, offset in zip(buffers, offsets, strict=True):
        if type(offset) is not int or offset < 0:
            raise InvalidPlanError(f"buffer {buffer.id!r}: bad offset {offset!r}")
        if offset % buffer.alignment:
            raise InvalidPlanError(
                f"buffer {buffer.id!r}: offset {offset} is not a multiple of {buffer.alignment}"
            )
        if buffer.offset is not None and offset != buffer.offset:
            raise InvalidPlanError(
                f"buffer {buffer.id!r} is pinned at {buffer.offset}, the plan puts it at {offset}"
            )
    limit = capacity if capacity is not None else problem.capacity
    if limit is not None:
        for buffer, offset in zip(buffers, offsets, strict=True):
            if offset + buffer.nbytes > limit:
                raise InvalidPlanError(
                    f"buffer {buffer.id!r} ends at {offset + buffer.nbytes}, "
                    f"past the capacity {limit}"
                )
    _sweep(buffers, offsets)


def _sweep(buffers: tuple[Buffer, ...], offsets: tuple[int, ...]) -> None:
    # (time, 0 for an end / 1 for a start, buffer): ends sort first at equal times.
    events = sorted([(b.start, 1, i) for i, b in enumerate(buffers)]
                    + [(b.end, 0, i) for i, b in enumerate(buffers)])
    lows: list[int] = []  # offsets of the live non-empty buffers, sorted (distinct: disjoint)
    owners: list[int] = []  # their buffers, in the same order
    points: list[tuple[int, int]] = []  # (offset, buffer) of the live zero-byte buffers, sorted
    for _, starting, i in events:
        low = offsets[i]
        high = low + buffers[i].nbytes
        if not starting:
            if high > low:
                k = bisect_left(lows, low)
                del lows[k], owners[k]
            else:
                points.remove((low, i))
            continue
        if high == low:
            k = bisect_left(lows, low) - 1  # the interval starting below the point, if any
            if k >= 0 and buffers[owners[k]].nbytes + lows[k] > low:
                _clash(buffers, offsets, owners[k], i)
            insort(points, (low, i))
            continue
        k = bisect_left(lows, low)
        if k < len(lows) and lows[k] < high:
            _clash(buffers, offsets, owners[k], i)
        if k > 0 and lows[k - 1] + buffers[owners[k - 1]].nbytes > low:
            _clash(buffers, offsets, owners[k - 1], i)
        p = bisect_right(points, (low, len(buffers)))  # first point strictly above low
        if p < len(points) and points[p][0] < high:
            _clash(buffers, offsets, points[p][1], i)
        lows.insert(k, low)
        owners.insert(k, i)


def _clash(buffers: tuple[Buffer, ...], offsets: tuple[int, ...], j: int, i: int) -> None:
    a, b = buffers[i], buffers[j]
    a_low, b_low = offsets[i], offsets[j]
    raise InvalidPlanError(
        f"buffers {b.id!r} [{b.start}, {b.end}) at [{b_low}, {b_low + b.nbytes}) and "
        f"{a.id!r} [{a.start}, {a.end}) at [{a_low}, {a_low + a.nbytes}) overlap in time "
        "and space"
    )


def is_valid(problem: Problem, plan: Plan, *, capacity: Size | None = None) -> bool:
    """True if :func:`validate` finds nothing wrong."""
    try:
        validate(problem, plan, capacity=capacity)
    except InvalidPlanError:
        return False
    return True
