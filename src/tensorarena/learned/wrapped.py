"""Lifetimes that wrap around a repeating step's marker, placed exactly.

A training loop that calls ``zero_grad()`` between the forward and the backward pass makes its
gradients in step k's backward pass and frees them in step k + 1, after that step's forward
pass. On a repeating step's clock (``[0, T)``, the marker at both ends) such a block lives
``[birth, T)`` and again ``[0, death)``: one lifetime that wraps around the marker, which the
planner's single intervals cannot state. Held all step
(:meth:`~tensorarena.learned.recording.StepRecording.held`) its bytes are idle over
``[death, birth)``; rotated to a cut after its free
(:meth:`~tensorarena.learned.recording.StepRecording.rotated`) the activations live across the
cut instead and have no slot.

:func:`wrapped_problem` places it exactly: each block live across the marker becomes two
buffers *pinned at one offset*, ``[0, death)`` (the previous step's copy) and ``[birth, T)``
(this step's), named ``"i/0"`` and ``"i"`` for its position ``i``. The blocks live across the
marker are stacked first from offset 0, and everything else is left free for the planner,
which places it around those pins: the bytes a gradient leaves between its death and its next
birth serve the activations. All of them are live at the marker, so any order of the stack
holds them in the same bytes; the order is by birth, the earliest lowest: between the deaths
and their births the slots not yet made again are then the top of the stack, one range that
joins the bytes above it (where the forward pass's activations lie), which the backward pass's
temporaries can fill. (Stacked by size instead, the largest lowest, a small encoder layer's
plan stayed above its bound where the order by birth reaches it: bench/RESULTS.md.)

Serving such a plan needs nothing new: a slot is handed out only when no live block overlaps
its bytes (:class:`~tensorarena.learned.step_plan.Occupancy`), and a wrapped block's slot is
occupied at the step's start by the previous step's copy until it is freed, exactly as the pin
``[0, death)`` says. Where that copy lives longer than planned (or lived in the pool, the plan's
first step), the check refuses or the slot is simply free: never an alias.

The deaths are known as one point: the carried blocks are freed before the step's ``cut``-th
allocation (the last carried free, :attr:`~tensorarena.learned.LearnedPlans` and the native
server book only that), so every wrapped block is taken to die there: exact for
``zero_grad()``, which frees them together, and safe (later than it does) otherwise. A carried
block born before that point would need two slots at once; it keeps none (the pool serves it, as
today's plans do).
"""

from __future__ import annotations

from collections.abc import Collection

from tensorarena.learned.recording import StepRecording
from tensorarena.planning.problem import Buffer, Problem

__all__ = ["HEAD", "position_of", "wrapped_problem", "wrapping"]

#: The suffix of the buffer that holds a wrapped block's previous copy, ``[0, death)``.
HEAD = "/0"


def position_of(buffer_id: str) -> int:
    """The step position a buffer of :func:`wrapped_problem` (or of
    :meth:`StepRecording.problem`) stands for."""
    return int(buffer_id.partition("/")[0])


def wrapping(recording: StepRecording, carried: Collection[int], cut: int
             ) -> tuple[int, list[int]]:
    """The tick at which the carried blocks die on the step's clock (the start of allocation
    ``cut``, or the step's end), and the positions of the blocks that wrap: carried, outlived
    the recording, and born at or after that tick. None wraps when the tick is 0 (the frees
    came before the step's first allocation: a rotation is exact then)."""
    allocations = recording.allocations
    death = allocations[cut].start if 0 <= cut < len(allocations) else recording.ticks
    if death <= 0:
        return 0, []
    return death, [i for i in sorted(carried)
                   if 0 <= i < len(allocations) and allocations[i].end is None
                   and death <= allocations[i].start < recording.ticks]


def wrapped_problem(recording: StepRecording, carried: Collection[int], cut: int
                    ) -> Problem | None:
    """The planning problem of ``recording`` as a repeating step whose blocks ``carried`` into
    the next step (positions) are freed there before its ``cut``-th allocation: each wrapping
    block as two pinned pieces at one offset (module docstring), every block freed within the
    step free to place. ``None`` when no block wraps (the plans of today are exact then)."""
    death, wraps = wrapping(recording, carried, cut)
    if not wraps:
        return None
    allocations, length = recording.allocations, recording.ticks
    buffers: list[Buffer] = []
    top = 0
    for i in sorted(wraps, key=lambda i: allocations[i].start):  # births are distinct ticks
        a = allocations[i]
        offset = -(-top // a.alignment) * a.alignment
        top = offset + a.nbytes
        buffers.append(Buffer(f"{i}{HEAD}", 0, death, a.nbytes, a.alignment, offset))
        buffers.append(Buffer(str(i), a.start, length, a.nbytes, a.alignment, offset))
    buffers.extend(Buffer(str(i), a.start, a.end, a.nbytes, a.alignment)
                   for i, a in enumerate(allocations) if a.end is not None)
    return Problem(buffers, name="learned step, wrapped")
