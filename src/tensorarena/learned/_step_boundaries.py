"""How :class:`~tensorarena.learned.LearnedPlans` moves from step to step: a mixin.

At a step's end (a marker, or a boundary the step finder found) the step is compared with the
plan that served it, and a plan is learned where the rules of
:mod:`~tensorarena.learned.plan_cache` say so; the next step begins with a fresh recorder. As a
step's first allocations arrive, its plan is chosen by their sizes. The resource's module keeps
its calls (``allocate``, ``deallocate``, ``step``); these are the transitions between them.
"""

from __future__ import annotations

from tensorarena.adaptors.counting import Counting
from tensorarena.learned.fallback import SegregatedFallback
from tensorarena.learned.plan_cache import PlanCache
from tensorarena.learned.recording import FinishedStep, Recorder
from tensorarena.learned.report import FallbackReason
from tensorarena.learned.step_finder import StepFinder
from tensorarena.learned.step_plan import StepCursor

__all__ = ["StepBoundaries"]


class StepBoundaries:
    """``_end_step``, ``_begin_step``, ``_choose`` and ``_find_steps`` of
    :class:`~tensorarena.learned.LearnedPlans` (its lock held)."""

    _plans: PlanCache
    _pool: SegregatedFallback
    _meter: Counting
    _finder: StepFinder | None
    _lookahead: int
    _live_bytes: int
    _serial: int
    _recorder: Recorder
    _observed: list[int]
    _cursor: StepCursor | None
    _unknown: bool
    _unserved: FallbackReason
    _step_served: int
    _previous: FinishedStep | None
    _carried: set[int]
    _cut: int
    _steps: int
    _peak_before: int
    _steady: bool

    def _new_recorder(self) -> Recorder:
        """A recorder for the step that begins (a native server puts its own here)."""
        return Recorder()

    def _end_step(self, *, learn: bool) -> None:
        cursor = self._cursor
        self._recorder.end(learned=learn)
        # The step compared by its signature, its StepRecording only if a plan is learned from it.
        recording = FinishedStep(self._recorder) if learn else None
        if recording is not None:
            self._steps += 1
            previous, carried = self._previous, self._carried
            if cursor is None:
                if self._unserved is FallbackReason.UNKNOWN_PATTERN:
                    # Cyclically at once if it freed the last step's blocks after allocating
                    # (zero_grad mid-step): its own are guessed to go the same way.
                    self._plans.learn_new(recording.recording(), (
                        previous.recording(), carried, self._cut)
                        if carried and self._cut and previous is not None else None)
                elif self._unserved is FallbackReason.CARRIED_BLOCKS and previous is not None:
                    # Planned from the last step, cut after this one's frees of its blocks.
                    self._plans.learn_cyclic(previous.recording(), carried, self._cut)
            elif (carried and previous is not None
                  and recording.same_as(previous)
                  and not (cursor.plan.cyclic
                           and recording.has_signature(cursor.plan.signature))):
                # The step repeats and carries blocks into the next: plan it cyclically.
                cursor.plan.steps_served += 1
                self._plans.learn_cyclic(previous.recording(), carried, self._cut)
            elif (carried and previous is not None and self._cut
                  and not cursor.plan.cyclic and not cursor.plan.steps_served
                  and previous.has_signature(cursor.plan.signature)
                  and self._plans.learn_guessed(recording.recording(), previous.recording(),
                                                carried, self._cut)):
                # A new plan's first step freed the recorded step's blocks after allocating
                # (zero_grad mid-step) and differs from it (that step made lasting state):
                # planned cyclically now, its carried blocks guessed from the last's, checked
                # at the next marker (PlanCache.learn_guessed).
                cursor.plan.steps_served += 1
            elif (cursor.plan.guessed is not None and previous is not None
                  and recording.same_as(previous)
                  and cursor.plan.guessed != (frozenset(carried), self._cut)):
                # The guess was wrong: plan the step again from what it did.
                cursor.plan.steps_served += 1
                cursor.plan.guessed = None
                self._plans.learn_cyclic(previous.recording(), carried, self._cut)
            else:
                cursor.plan.guessed = None
                cursor.plan.steps_served += 1
                self._plans.learn_again(cursor.plan, recording)
            if self._finder is not None and self._finder.step_ended(self._step_served,
                                                                    len(recording)):
                self._plans.retire_all()  # planned from a wrong period
        if len(self._plans):
            self._pool.trim()  # the memory the pool served this step goes back
        self._begin_step()
        self._previous = recording

    def _begin_step(self) -> None:
        self._serial += 1
        self._recorder = self._new_recorder()
        self._observed = []
        self._cursor = None
        self._unknown = False
        self._unserved = FallbackReason.UNKNOWN_PATTERN
        self._step_served = 0
        self._previous = None
        self._carried = set()
        self._cut = 0

    def _choose(self, nbytes: int, position: int) -> None:
        """Pick the plan for the step in progress from its first allocations."""
        observed = self._observed
        observed.append(nbytes)
        cursor = self._cursor
        if cursor is not None and cursor.plan.matches_prefix(observed):
            return
        plan = self._plans.choose(observed)
        if plan is None:
            self._cursor, self._unknown = None, True
            return
        if self._plans.defers(plan, self._previous, self._carried):
            self._cursor, self._unknown = None, True
            self._unserved = FallbackReason.CARRIED_BLOCKS
            return
        if plan.base is None:
            self._pool.trim()  # what the pool holds empty goes back before the arena comes
        try:
            self._plans.take_arena(plan)
        except MemoryError:
            self._cursor, self._unknown = None, True
            self._unserved = FallbackReason.NO_ARENA
            return
        if not plan.steps_served and position == 0:  # a new plan's first step: steady from here
            self._peak_before = max(self._peak_before,
                                    self._meter.statistics().requested_bytes.peak)
            self._meter.reset_peak_stats()
            self._steady = True
        self._cursor = StepCursor(plan, position, self._lookahead)

    def _find_steps(self, finder: StepFinder, nbytes: int) -> None:
        """Without markers, before each allocation: end the step at a boundary; plan the last
        step seen when the period is found."""
        learn = finder.at_boundary()
        if learn is not None:
            self._end_step(learn=learn)
        elif finder.period is None and len(self._recorder) >= finder.max_period:
            self._begin_step()  # no step is known: keep the log of one bounded
        found = finder.observe(nbytes, self._live_bytes)
        if found is not None:
            self._plans.learn(found.recording)
            if found.begins_now:
                self._begin_step()
