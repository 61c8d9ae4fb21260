"""What a :class:`~tensorarena.learned.LearnedPlans` did: frozen records, and why it fell back.

An allocation is either *served* from a planned slot or *falls back* to the dynamic pool, for
exactly one :class:`FallbackReason`. The counts add up: ``served + fell_back == allocations``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["FallbackReason", "LearnedPlansReport", "PlanSummary"]


class FallbackReason(enum.Enum):
    """Why an allocation was served by the dynamic pool instead of a planned slot."""

    #: no plan matches the step (its first allocations are new: the step is being recorded)
    UNKNOWN_PATTERN = "unknown_pattern"
    #: no allocation of this size was recorded in the step
    SIZE_MISMATCH = "size_mismatch"
    #: the step has this size, but not near this position (the order changed too much)
    ORDER_MISMATCH = "order_mismatch"
    #: the planned bytes are still held by a live block (one kept from an earlier step, or
    #: served out of order): handing them out would alias it
    SLOT_OCCUPIED = "slot_occupied"
    #: this allocation outlived its step when it was recorded, so it has no slot
    OUTLIVED_RECORDING = "outlived_recording"
    #: the request asks for a stricter alignment than the slot's address has
    ALIGNMENT = "alignment"
    #: the plan's arena could not be had from the upstream (out of memory)
    NO_ARENA = "no_arena"
    #: the step freed blocks its plan's recording left live before it allocated (gradients
    #: freed first): it is served by the pool, not beside them in the arena, while the pattern
    #: is planned again cyclically
    CARRIED_BLOCKS = "carried_blocks"


@dataclass(frozen=True, slots=True)
class PlanSummary:
    """One learned plan: its key, what it places and how well."""

    key: tuple[int, ...]  #: the sizes of the step's first allocations
    allocations: int  #: allocations in the recorded step
    planned: int  #: those that got a slot (the others outlived the step)
    height: int  #: the arena's size in bytes
    lower_bound: int  #: the peak of live bytes of the planned allocations
    optimal: bool  #: the planner proved that no lower arena exists
    planner: str
    steps_served: int  #: steps this plan served
    live_blocks: int  #: blocks live in its arena now


@dataclass(frozen=True, slots=True)
class LearnedPlansReport:
    """Counts since the resource was made (``LearnedPlans.report()``). Sizes in bytes."""

    steps: int  #: completed steps (markers, or periods found without markers)
    plans_learned: int  #: plans made (a pattern re-learned counts again)
    plans_evicted: int  #: plans dropped to stay within ``max_patterns`` (or re-learned)
    allocations: int
    served: int  #: served from a planned slot
    served_out_of_order: int  #: of those, served from a slot other than the next one
    fell_back: int  #: served by the dynamic pool; by reason below
    unknown_pattern: int
    size_mismatch: int
    order_mismatch: int
    slot_occupied: int
    outlived_recording: int
    alignment: int
    no_arena: int
    carried_blocks: int
    reserved_bytes: int  #: held from the upstream now (arenas and the dynamic pool)
    peak_reserved_bytes: int  #: the most ever held
    #: the most held since the last new plan began to serve: the steady state once learning
    #: has settled (``None``: no plan served yet)
    steady_peak_reserved_bytes: int | None
    arena_bytes: int  #: held in planned arenas now
    period: int | None  #: allocations per step found without markers (``None``: not found)
    plans: tuple[PlanSummary, ...] = field(default=())

    def fallbacks(self) -> dict[FallbackReason, int]:
        """The fallbacks by reason (every reason, zeros included)."""
        return {reason: getattr(self, reason.value) for reason in FallbackReason}
