"""How :class:`~tensorarena.learned.LearnedPlans` books what a native server did: a mixin.

A native server (the route of :func:`tensorarena.torch.learned`,
:mod:`~tensorarena.learned.native_serving`) hands out the current plan's next slots with no
call to the plans. It is paused while the plans run (their lock's hooks), and what it did
meanwhile is booked first, in order: ``_book_native`` mirrors what ``allocate`` books for a
served slot and ``deallocate`` for a freed block, but for the step's log: the server logs into
it itself (each step's recorder is then a log the server shares,
:class:`~tensorarena.learned.native_recorder.NativeRecorder`). The resource's module knows
nothing of it but this mixin; the record of a live block, :class:`LiveBlock`, is shared by both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from tensorarena.learned.plan_cache import PlanCache
from tensorarena.learned.recording import FinishedStep, Recorder
from tensorarena.learned.step_finder import StepFinder
from tensorarena.learned.step_plan import StepCursor, StepPlan

__all__ = ["LiveBlock", "NativeBooking"]


class LiveBlock(NamedTuple):
    """A live block: its size, where it lies and where its step logged it."""

    nbytes: int
    plan: StepPlan | None  #: None: the block is in the pool
    offset: int  #: in the plan's arena
    serial: int  #: the step it was allocated in
    number: int = 0  #: its number in that step's recording
    epoch: int = -1  #: without markers: the history it is logged in
    history: int = -1  #: its number in that history


class NativeBooking:
    """``_serve_natively``, ``_native_state`` and ``_book_native``: the plans' side of a
    native server."""

    _lock: threading.RLock
    _plans: PlanCache
    _finder: StepFinder | None
    _closed: bool
    _blocks: dict[int, LiveBlock]
    _serial: int
    _recorder: Recorder
    _cursor: StepCursor | None
    _observed: list[int]
    _unknown: bool
    _lookahead: int
    _previous: FinishedStep | None
    _carried: set[int]
    _cut: int
    _live_bytes: int
    _peak_live: int
    _total_bytes: int
    _peak_blocks: int
    _allocations: int
    _served: int
    _step_served: int

    def _serve_natively(self, hook: Callable[[Any], AbstractContextManager[Any]],
                        new_recorder: Callable[[], Recorder]) -> AbstractContextManager[Any]:
        """Run every call under ``hook(lock)`` (a server's hooks around this resource's
        lock) and log each step from now on with ``new_recorder()`` (a log the server shares,
        from the next step on if this one has begun); returns the hooked lock."""
        with self._lock:
            self._lock = hooked = hook(self._lock)  # type: ignore[assignment]
            self._new_recorder = new_recorder
            if not len(self._recorder):
                self._recorder = new_recorder()
        return hooked

    def _native_state(self) -> tuple[StepPlan | None, int, int, int]:
        """Where the step stands for a native server leaving: the plan and position it may
        serve from (``None``: none), live bytes and blocks.

        A step that follows a plan past its key, in order, from a held arena, is served from
        where it is. A step that has not begun is served from the most recently used plan
        (what :meth:`PlanCache.choose` picks for each prefix of its key) if that plan has
        served a step already from an arena it holds: choosing it again changes nothing
        (:meth:`_choose`'s other cases are a new plan's first step or one with no arena), so
        the server can serve the key too, and the plans take the step as chosen when they
        book it."""
        cursor = self._cursor
        plan: StepPlan | None = None
        position = 0
        if self._closed or self._finder is not None:
            pass
        elif cursor is not None:
            if len(self._recorder) >= self._plans.key_length:
                position, skipped = cursor.save()
                if not skipped and cursor.plan.base is not None and not cursor.plan.retired:
                    plan = cursor.plan
        elif not self._unknown and not len(self._recorder):
            latest = self._plans.latest()
            if latest is not None and latest.base is not None and latest.steps_served:
                plan = latest
        return plan, position, self._live_bytes, len(self._blocks)

    def _book_native(self, booked: tuple[Any, ...], plans: Mapping[int, StepPlan],
                     live: int, count: int) -> None:
        """Book what a native server did since it left with ``live`` bytes in ``count``
        blocks (``booked``: ``serving_pause``'s digest, see ``_torch_cpu_serving.cpp``; what
        it logged is in the step's log already)."""
        (served, made_table, made_slot, dropped, carried, cut, change, highest,
         blocks_change, blocks_highest, total, unbooked, raw) = booked
        blocks, serial = self._blocks, self._serial
        for address in dropped:
            self._plans.freed_from(blocks.pop(address).plan)  # type: ignore[arg-type]
        if carried:
            self._carried.update(carried)
            self._cut = max(self._cut, cut)
        for i in range(0, len(unbooked), 5):
            address, table, slot, nbytes, number = unbooked[i:i + 5]
            plan = plans[table]
            blocks[address] = LiveBlock(nbytes, plan, plan.offsets[slot], serial, number)
        if served or change or blocks_change:
            self._live_bytes = live + change
            self._peak_live = max(self._peak_live, live + highest)
            self._peak_blocks = max(self._peak_blocks, count + blocks_highest)
            self._served += served
            self._step_served += served
            self._allocations += served
            self._total_bytes += total
            cursor, plan = self._cursor, plans[made_table]
            if served and cursor is None:  # the step began served: its plan chosen natively
                self._cursor = StepCursor(plan, made_slot + 1, self._lookahead)
                self._observed = list(plan.key[:made_slot + 1])
            elif served and cursor is not None and cursor.plan is plan:
                cursor.position = made_slot + 1
        for address in raw:  # freed while this resource ran (logged by the server)
            block = blocks.pop(address)
            self._live_bytes -= block.nbytes
            self._plans.freed_from(block.plan)  # type: ignore[arg-type]
