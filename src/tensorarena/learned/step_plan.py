"""One learned plan: a recorded step's slots in one arena, which bytes are live, and matching.

A :class:`StepPlan` is made from a :class:`~tensorarena.learned.recording.StepRecording` by the
planner of :mod:`tensorarena.planning` under a *node* budget (never the clock), so the same
recording gives the same offsets on any machine under any load. Allocations that outlived their
recorded step have no slot.

**Never alias a live block.** The plan keeps the byte ranges of the live blocks in its arena,
pairwise disjoint (:class:`Occupancy`), and hands a slot out only when its bytes overlap none of
them. In a step that repeats the recording this is exactly the plan's promise (every block
planned into overlapping bytes earlier in the step was freed); when the program did something
else (kept a block past its step, reordered its allocations) the check refuses the slot and the
allocation falls back, so the rule holds whatever the caller does, not just when it repeats.
A block whose lifetime wraps around the marker (:mod:`~tensorarena.learned.wrapped`) needs
nothing more: its slot is occupied at the step's start by the last step's copy until that is
freed, as its plan's pinned piece ``[0, death)`` says.

**Matching** (:class:`StepCursor`). The i-th allocation of a step takes slot i when its size
matches. When it does not, the cursor looks for a slot of that size among the slots it skipped
in this step and then up to ``lookahead`` slots ahead (a deleted or swapped allocation), jumps
there and remembers what it skipped. Positions whose allocation outlived the recording have no
slot: the search passes over them without counting them, so a later step that no longer makes
the first step's lasting state (an optimizer's, made once) finds the slots past that burst
instead of falling back for the rest of it. When nothing of that size is near, the allocation falls
back and the cursor stays: the next allocation may realign (an inserted allocation), or be found
one ahead (a changed size). Matching never stops for the rest of a step: a step that differs in
one place is served everywhere else.
"""

from __future__ import annotations

import bisect
import math

from tensorarena.learned.recording import Signature, StepRecording
from tensorarena.learned.report import FallbackReason
from tensorarena.learned.wrapped import position_of
from tensorarena.planning.planners import plan
from tensorarena.planning.problem import Problem

__all__ = ["Occupancy", "StepCursor", "StepPlan"]

#: The arena's alignment at least: what a host allocation gets (and PyTorch's CPU allocator's 64).
_MIN_ARENA_ALIGNMENT = 256


class Occupancy:
    """The byte ranges ``[lo, hi)`` of the live blocks of one arena, pairwise disjoint."""

    __slots__ = ("_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __len__(self) -> int:
        return len(self._starts)

    def is_free(self, lo: int, hi: int) -> bool:
        """True if ``[lo, hi)`` overlaps no live range (a zero-length range at ``lo`` counts as
        one byte, so that two blocks never share a start)."""
        hi = max(hi, lo + 1)
        # Disjoint ranges sorted by start are sorted by end too: only the last range that
        # starts before ``hi`` can reach into ``[lo, hi)``.
        i = bisect.bisect_left(self._starts, hi) - 1
        return i < 0 or self._ends[i] <= lo

    def take(self, lo: int, hi: int) -> None:
        """Mark ``[lo, hi)`` live (the caller checked :meth:`is_free`)."""
        i = bisect.bisect_left(self._starts, lo)
        self._starts.insert(i, lo)
        self._ends.insert(i, max(hi, lo + 1))

    def release(self, lo: int) -> None:
        """Mark the range that starts at ``lo`` free."""
        i = bisect.bisect_left(self._starts, lo)
        del self._starts[i]
        del self._ends[i]

    def ranges(self) -> list[tuple[int, int]]:
        """The live ranges ``(lo, hi)``, by ``lo``."""
        return list(zip(self._starts, self._ends, strict=True))


class StepPlan:
    """Offsets for a recorded step's allocations in one arena, and the arena's live blocks."""

    def __init__(self, recording: StepRecording, *, key_length: int,
                 node_limit: int | None, cyclic: StepRecording | Problem | None = None) -> None:
        # A cyclic plan is made from ``recording.rotated(...)`` or ``.held(...)`` (passed as
        # ``cyclic``: its lifetimes) or from a problem whose lifetimes wrap around the marker
        # (:func:`~tensorarena.learned.wrapped.wrapped_problem`: a position may have two
        # buffers, pinned at one offset); the recording's signature either way.
        signature = recording.signature()
        if isinstance(cyclic, Problem):
            problem = cyclic
        else:
            if cyclic is not None:
                recording = cyclic
            problem = recording.problem()
        made = plan(problem, "auto", node_limit=node_limit, time_limit=math.inf)
        offsets: list[int | None] = [None] * len(recording)
        for buffer, offset in zip(problem.buffers, made.offsets, strict=True):
            offsets[position_of(buffer.id)] = offset
        self.key = recording.key(key_length)
        self.sizes = recording.sizes
        self.signature = signature
        self.cyclic = cyclic is not None
        self.size_set = frozenset(self.sizes)
        self.offsets: tuple[int | None, ...] = tuple(offsets)
        # For matching out of order: the slots of each size, in order, and how many slots come
        # before each position (the allocations that outlived the recording have none).
        self._slots_of: dict[int, list[int]] = {}
        before = [0]
        for i, (size, planned) in enumerate(zip(self.sizes, offsets, strict=True)):
            if planned is not None:
                self._slots_of.setdefault(size, []).append(i)
            before.append(before[-1] + (planned is not None))
        self._slots_before = before
        self.height = made.height
        self.lower_bound = problem.lower_bound()
        self.optimal = made.optimal
        self.planner = made.planner
        self.planned = before[-1]  #: positions with a slot
        #: the bytes of the allocations with no slot (they outlived the recording's window)
        self.unplanned_bytes = sum(n for n, o in zip(self.sizes, offsets, strict=True)
                                   if o is None)
        self.arena_bytes = max(self.height, 1)  #: what the arena takes from the upstream
        self.alignment = max([_MIN_ARENA_ALIGNMENT, *(b.alignment for b in problem.buffers)])
        self.base: int | None = None  #: the arena's address while it is held
        self.occupancy = Occupancy()
        self.steps_served = 0
        self.retired = False  #: evicted or re-learned: the arena goes back once empty
        #: the signature of the last step that differed from the recording: re-learned from
        #: if the next one has it too
        self.candidate: Signature | None = None
        #: a plan learned before its step's carried blocks were seen: the positions and cut
        #: it guessed (checked at the next marker, then ``None``)
        self.guessed: tuple[frozenset[int], int] | None = None

    def __repr__(self) -> str:
        return (f"StepPlan(allocations={len(self.sizes)}, planned={self.planned}, "
                f"height={self.height}, lower_bound={self.lower_bound}, "
                f"live={len(self.occupancy)})")

    def next_slot(self, nbytes: int, position: int, lookahead: int) -> int | None:
        """The first position after ``position`` with a slot of ``nbytes`` bytes, if fewer than
        ``lookahead`` slots lie between (positions without a slot are passed over free)."""
        slots = self._slots_of.get(nbytes)
        if not slots:
            return None
        k = bisect.bisect_right(slots, position)
        if k == len(slots):
            return None
        found = slots[k]
        before = self._slots_before
        return found if before[found] - before[position + 1] < lookahead else None

    def matches_prefix(self, observed: list[int]) -> bool:
        """True if the step's first allocations had the sizes ``observed``."""
        return len(observed) <= len(self.sizes) and list(self.sizes[:len(observed)]) == observed


class StepCursor:
    """Where a step is in its plan (see the module docstring for the matching rule)."""

    __slots__ = ("_lookahead", "_skipped", "plan", "position")

    def __init__(self, plan: StepPlan, position: int, lookahead: int) -> None:
        self.plan = plan
        self.position = position
        self._lookahead = lookahead
        self._skipped: dict[int, None] = {}  # slots passed over in this step, oldest first

    def save(self) -> tuple[int, dict[int, None] | None]:
        """The cursor's state, to :meth:`restore` if the allocation it matched fails."""
        return self.position, dict(self._skipped) if self._skipped else None

    def restore(self, state: tuple[int, dict[int, None] | None]) -> None:
        """Go back to a state :meth:`save` returned."""
        self.position, self._skipped = state[0], dict(state[1] or {})

    def match(self, nbytes: int, alignment: int) -> tuple[int, bool] | FallbackReason:
        """The slot for the next allocation and whether it was out of order, or why none."""
        plan, position = self.plan, self.position
        sizes = plan.sizes
        if position < len(sizes) and sizes[position] == nbytes:
            slot, reordered = position, False
            self.position = position + 1
        else:
            found = next((j for j in self._skipped if sizes[j] == nbytes), None)
            if found is not None:
                del self._skipped[found]
            else:
                found = plan.next_slot(nbytes, position, self._lookahead)
                if found is None:
                    return (FallbackReason.ORDER_MISMATCH if nbytes in plan.size_set
                            else FallbackReason.SIZE_MISMATCH)
                offsets = plan.offsets
                for j in range(position, found):
                    if offsets[j] is not None:
                        self._skipped[j] = None
                while len(self._skipped) > self._lookahead:
                    del self._skipped[next(iter(self._skipped))]
                self.position = found + 1
            slot, reordered = found, True
        offset = plan.offsets[slot]
        if offset is None:
            return FallbackReason.OUTLIVED_RECORDING
        if plan.base is None:  # retired while the step ran, and its arena went back
            return FallbackReason.NO_ARENA
        if (plan.base + offset) & (alignment - 1):
            return FallbackReason.ALIGNMENT
        if not plan.occupancy.is_free(offset, offset + nbytes):
            return FallbackReason.SLOT_OCCUPIED
        return slot, reordered
