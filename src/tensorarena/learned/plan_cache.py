"""The learned plans of one resource: at most ``max_patterns``, least recently used first.

:class:`PlanCache` decides which plans are kept and holds their arenas, each taken from the
upstream in one piece when its plan first serves. The rules (why: the module docstring of
:mod:`~tensorarena.learned.learned_plans`):

* a plan is looked up by the sizes of a step's first allocations, most recently used first;
* a new pattern is learned at once while there is room, else only when it recurs;
* a pattern whose steps differ from its plan the same way twice in a row is learned again;
* a pattern whose step repeats and carries blocks into the next (gradients freed by the next
  ``zero_grad``) is learned again once, cyclically, so that those blocks get slots too: cut
  after their frees (:meth:`StepRecording.rotated`) or, when that cut falls inside the step
  and costs more, at the marker with them held all step (:meth:`StepRecording.held`) or with
  their lifetimes wrapped around the marker (:mod:`~tensorarena.learned.wrapped`);
* a step that frees the last step's carried blocks mid-step and is learned new, or is a new
  plan's first step and differs from the step it was learned from, is learned cyclically at
  once, the blocks it carries guessed (:meth:`PlanCache.learn_guessed`) and checked at the
  next marker (planned again from what it did if wrong);
* a new plan is not served (its arena is not taken) by a step that has already freed blocks
  its recording left live: the pool holds the next copy of those blocks, and serving the rest
  from the arena would hold the arena and those blocks at once, above a pool's peak; the step
  is served by the pool and the plan learned again cyclically from its recording at once;
* to make room the least recently used plan goes, preferring one with no live block; a plan
  that goes while blocks live in its arena is *retired*: the arena goes back with its last block.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Collection

from tensorarena.errors import DoubleFreeError, InvalidAddressError
from tensorarena.learned.recording import FinishedStep, StepRecording
from tensorarena.learned.report import PlanSummary
from tensorarena.learned.step_plan import StepPlan
from tensorarena.learned.wrapped import wrapped_problem
from tensorarena.memory.resource import MemoryResource
from tensorarena.planning.problem import Problem

__all__ = ["PlanCache"]


class PlanCache:
    """The plans, their arenas (from ``upstream``) and the keys seen without a plan."""

    def __init__(self, upstream: MemoryResource, *, max_patterns: int, key_length: int,
                 node_limit: int | None) -> None:
        self._upstream = upstream
        self.max_patterns = max_patterns
        self.key_length = key_length
        self._node_limit = node_limit
        self._plans: OrderedDict[tuple[int, ...], StepPlan] = OrderedDict()  # LRU first
        self._retired: list[StepPlan] = []
        self._unplanned: OrderedDict[tuple[int, ...], None] = OrderedDict()  # keys seen once
        self.learned = self.evicted = 0
        self.arena_bytes = 0  #: held in arenas now

    def __len__(self) -> int:
        return len(self._plans)

    def choose(self, observed: list[int]) -> StepPlan | None:
        """The most recently used plan whose step began with the sizes ``observed``."""
        plan = next((p for p in reversed(self._plans.values()) if p.matches_prefix(observed)),
                    None)
        if plan is not None:
            self._plans.move_to_end(plan.key)
        return plan

    def latest(self) -> StepPlan | None:
        """The most recently used plan (what :meth:`choose` picks first), if any."""
        return next(reversed(self._plans.values()), None)

    def take_arena(self, plan: StepPlan) -> None:
        """Give ``plan`` its arena if it has none (the upstream's MemoryError goes on)."""
        if plan.base is None:
            plan.base = self._upstream.allocate(plan.arena_bytes, plan.alignment)
            self.arena_bytes += plan.arena_bytes

    def defers(self, plan: StepPlan, previous: FinishedStep | None,
               carried: Collection[int]) -> bool:
        """True if ``plan``, chosen by a step that has freed the blocks ``carried`` of the
        step before (``previous``, ``None``: not learned from), should not serve it: the plan
        was learned from that step and has not served yet."""
        return (bool(carried) and plan.base is None and not plan.steps_served
                and not plan.cyclic and previous is not None
                and previous.has_signature(plan.signature))

    def learn_new(self, recording: StepRecording,
                  guess: tuple[StepRecording, Collection[int], int] | None = None) -> None:
        """A step no plan matched: learn it if there is room or its pattern recurred
        (cyclically when ``guess`` says it freed blocks of the step before after allocating:
        :meth:`learn_guessed` of that step, those blocks and the cut)."""
        key = recording.key(self.key_length)
        if len(self._plans) < self.max_patterns or key in self._unplanned:
            self._unplanned.pop(key, None)
            if guess is None or not self.learn_guessed(recording, *guess):
                self.learn(recording)
            return
        self._unplanned[key] = None
        while len(self._unplanned) > 4 * self.max_patterns:
            self._unplanned.popitem(last=False)

    def learn_again(self, plan: StepPlan, step: FinishedStep) -> None:
        """A step ``plan`` served: plan its pattern again if it differed the same way twice
        (a step that repeated the plan is compared, not recorded again)."""
        if step.has_signature(plan.signature):
            plan.candidate = None
        elif (plan.candidate is not None and step.has_signature(plan.candidate)
              and step.key(self.key_length) == plan.key):
            self.learn(step.recording())
        else:
            plan.candidate = step.signature

    def learn(self, recording: StepRecording, *, cyclic: StepRecording | None = None) -> None:
        """Plan ``recording`` (with ``cyclic``'s lifetimes: its rotation) and keep the plan,
        making room if needed."""
        if len(recording):
            self._keep(StepPlan(recording, key_length=self.key_length,
                                node_limit=self._node_limit, cyclic=cyclic))

    def learn_cyclic(self, recording: StepRecording, carried: Collection[int],
                     cut: int) -> StepPlan | None:
        """Plan ``recording`` cyclically: its blocks ``carried`` into the next step were freed
        there after its first ``cut`` allocations. Up to three windows are planned when
        ``cut > 0``: rotated at the cut (:meth:`StepRecording.rotated`: a block live across
        the cut gets no slot), at the marker with the carried blocks held all step
        (:meth:`StepRecording.held`), and at the marker with their lifetimes wrapped around it
        (:func:`~tensorarena.learned.wrapped.wrapped_problem`, when one wraps); the plan kept
        has the lower arena plus bytes without a slot (those the pool holds every step, with
        its overhead and a fallback each: on a tie the plan with fewer, then the earlier)."""
        if not len(recording):
            return None
        windows: list[StepRecording | Problem] = [recording.rotated(carried, cut)]
        if cut:
            windows.append(recording.held(carried))
            wrapped = wrapped_problem(recording, carried, cut)
            if wrapped is not None:
                windows.append(wrapped)
        plans = [StepPlan(recording, key_length=self.key_length, node_limit=self._node_limit,
                          cyclic=window) for window in windows]
        return self._keep(min(plans, key=lambda p: (p.height + p.unplanned_bytes,
                                                     p.unplanned_bytes)))

    def learn_guessed(self, recording: StepRecording, recorded: StepRecording,
                      carried: Collection[int], cut: int) -> bool:
        """Plan ``recording`` cyclically before the next step shows which of its blocks it
        carries; True if a plan was kept. ``recording`` freed the blocks ``carried`` of the
        step before it (``recorded``, which differed from it: lasting state made once, or an
        allocation more) after its first ``cut`` allocations; its own blocks that outlived it
        are guessed to go the same way: as many of each size as were carried, the latest made
        first, freed after the next step's first ``cut`` allocations. The plan remembers the
        guess (:attr:`StepPlan.guessed`): a next step that carries other blocks has the
        pattern planned again from what it did. A wrong guess costs slots, never an alias (a
        slot still occupied is refused)."""
        made = recorded.allocations
        left = Counter(made[i].nbytes for i in carried if 0 <= i < len(made))
        guess = set()
        for i in range(len(recording) - 1, -1, -1):
            a = recording.allocations[i]
            if a.end is None and left[a.nbytes] > 0:
                left[a.nbytes] -= 1
                guess.add(i)
        if not guess:
            return False
        kept = self.learn_cyclic(recording, guess, cut)
        if kept is None:
            return False
        kept.guessed = (frozenset(guess), cut)
        return True

    def _keep(self, plan: StepPlan) -> StepPlan | None:
        if not plan.planned:
            return None
        old = self._plans.pop(plan.key, None)
        if old is not None:
            self._retire(old)
        while len(self._plans) >= self.max_patterns:
            victim = next((k for k, p in self._plans.items() if not len(p.occupancy)),
                          next(iter(self._plans)))
            self._retire(self._plans.pop(victim))
        self._plans[plan.key] = plan
        self.learned += 1
        return plan

    def freed_from(self, plan: StepPlan) -> None:
        """A block of ``plan``'s arena was freed: a retired arena goes back once empty."""
        if plan.retired and not len(plan.occupancy):
            self._release(plan)

    def retire_all(self) -> None:
        """Drop every plan (arenas with live blocks go back with their last block)."""
        for plan in list(self._plans.values()):
            self._retire(plan)
        self._plans.clear()

    def not_live(self, address: int) -> InvalidAddressError | None:
        """The error for freeing ``address`` if it lies in an arena (else ``None``)."""
        for plan in [*self._plans.values(), *self._retired]:
            if plan.base is not None and 0 <= address - plan.base < plan.arena_bytes:
                if address - plan.base in plan.offsets:
                    return DoubleFreeError(
                        f"address {address:#x} is a slot of a learned arena with no live "
                        "block: freed twice?", address=address)
                return InvalidAddressError(
                    f"address {address:#x} is inside a learned arena but no block starts "
                    "there", address=address)
        return None

    def summaries(self) -> tuple[PlanSummary, ...]:
        """One record per plan, least recently used first."""
        return tuple(
            PlanSummary(key=p.key, allocations=len(p.sizes), planned=p.planned,
                        height=p.height, lower_bound=p.lower_bound, optimal=p.optimal,
                        planner=p.planner, steps_served=p.steps_served,
                        live_blocks=len(p.occupancy))
            for p in self._plans.values())

    def _retire(self, plan: StepPlan) -> None:
        plan.retired = True
        self.evicted += 1
        if len(plan.occupancy):
            self._retired.append(plan)
        else:
            self._release(plan)

    def _release(self, plan: StepPlan) -> None:
        if plan.base is not None:
            self._upstream.deallocate(plan.base, plan.arena_bytes)
            self.arena_bytes -= plan.arena_bytes
            plan.base = None
        if plan in self._retired:
            self._retired.remove(plan)
