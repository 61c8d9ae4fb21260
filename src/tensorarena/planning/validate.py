"""An independent checker of plans, short enough to be obviously correct.

It shares no code with any planner. It sweeps time in order; when a buffer starts, it is compared
with every buffer still live, in both time and space. Cost: O(n log n + n × live), which is fine
for the largest real traces (tens of thousands of buffers, hundreds live at once).
"""

from __future__ import annotations

from tensorarena.errors import InvalidArgumentError, InvalidPlanError
from tensorarena.planning._options import check_capacity, check_problem
from tensorarena.planning.problem import Plan, Problem
from tensorarena.sizes import Size

__all__ = ["is_valid", "validate"]


def validate(problem: Problem, plan: Plan, *, capacity: Size | None = None) -> None:
    """Raise :class:`InvalidPlanError` naming the first violation; return if the plan is valid.

    Checks: one non-negative, aligned offset per buffer; no two buffers that are live at the same
    time share a byte; the height fits ``capacity`` (or ``problem.capacity``) if one is given.
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
    limit = capacity if capacity is not None else problem.capacity
    if limit is not None:
        for buffer, offset in zip(buffers, offsets, strict=True):
            if offset + buffer.nbytes > limit:
                raise InvalidPlanError(
                    f"buffer {buffer.id!r} ends at {offset + buffer.nbytes}, "
                    f"past the capacity {limit}"
                )
    order = sorted(range(len(buffers)), key=lambda i: buffers[i].start)
    live: list[int] = []
    for i in order:
        a = buffers[i]
        live = [j for j in live if buffers[j].end > a.start]
        a_low, a_high = offsets[i], offsets[i] + a.nbytes
        for j in live:
            b = buffers[j]
            b_low, b_high = offsets[j], offsets[j] + b.nbytes
            if a_low < b_high and b_low < a_high:
                raise InvalidPlanError(
                    f"buffers {b.id!r} [{b.start}, {b.end}) at [{b_low}, {b_high}) and "
                    f"{a.id!r} [{a.start}, {a.end}) at [{a_low}, {a_high}) overlap in time "
                    "and space"
                )
        live.append(i)


def is_valid(problem: Problem, plan: Plan, *, capacity: Size | None = None) -> bool:
    """True if :func:`validate` finds nothing wrong."""
    try:
        validate(problem, plan, capacity=capacity)
    except InvalidPlanError:
        return False
    return True
