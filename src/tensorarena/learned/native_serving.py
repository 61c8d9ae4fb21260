"""Serving a :class:`~tensorarena.learned.LearnedPlans`' slots in C++, with no Python call.

On a torch CPU route (:func:`tensorarena.torch.learned`) every allocation would call
:meth:`LearnedPlans.allocate <tensorarena.learned.LearnedPlans.allocate>`: microseconds each, a
step's worth of them a large part of a small model's step. A :class:`NativeServing` gives the
route a *server* (``_torch_cpu_serving.cpp`` in :mod:`tensorarena.interop.torch_cpu_shim`):
the table of each plan that serves (per step position: size and offset in the arena) and the
arena's live byte ranges. Whenever the plans are left with a step following a plan in order,
past its key, the server is *armed* at the step's position, and serves the next allocations
itself while each has its recorded size, its slot an offset, and its bytes overlap no live
range: the never-alias rule of :mod:`~tensorarena.learned.step_plan`, checked against the same
ranges (the plan's :class:`~tensorarena.learned.step_plan.Occupancy` is this server's while it
exists, so both sides take and release in one place). Their frees release their ranges there.
The route takes and frees these blocks with no GIL: the server's state is under a lock of its
own (``native_lock``), which every call from here takes too, so concurrent threads are safe.

Anything else, the first allocation that differs included, is the route's Python call as
before. The step's log is shared: each step's recorder is a
:class:`~tensorarena.learned.native_recorder.NativeRecorder`, a log in C++ told to the server as
the step begins, so the server logs what it serves and frees where it happens (numbered and
timed as the plans' recorder would) and a step that repeats its plan is compared with it in C++
at its marker. The server is *paused* while the plans run (the hooks of their lock) and *left*
as they are left; what else it did is booked by the plans when next entered (a digest:
counts, the live bytes' change and peak, the frees carried from the last step, a record of
each block still live), so the report and the statistics are the same as without a server. A
free that comes while the plans run is logged by the server and booked by them. A block whose
plan was replaced, or whose plans were closed, is booked when it is freed, so that an arena
goes back with its last block.
"""

from __future__ import annotations

import weakref
from array import array
from types import TracebackType
from typing import Any

from tensorarena.learned.learned_plans import LearnedPlans
from tensorarena.learned.native_recorder import NativeRecorder
from tensorarena.learned.step_plan import Occupancy, StepPlan

__all__ = ["NativeOccupancy", "NativeServing"]

#: The offset of a step position with no slot (its allocation outlived the recording).
NO_SLOT = (1 << 64) - 1


class NativeOccupancy(Occupancy):
    """A plan's live ranges, held by its native server (the same methods as ``Occupancy``)."""

    __slots__ = ("_capsule", "_shim", "_table")

    def __init__(self, shim: Any, capsule: Any, table: int) -> None:
        super().__init__()
        self._shim, self._capsule, self._table = shim, capsule, table

    def __len__(self) -> int:
        return len(self._shim.occupancy_ranges(self._capsule, self._table))

    def is_free(self, lo: int, hi: int) -> bool:
        """True if ``[lo, hi)`` overlaps no live range."""
        return bool(self._shim.occupancy_is_free(self._capsule, self._table, lo, hi))

    def take(self, lo: int, hi: int) -> None:
        """Mark ``[lo, hi)`` live."""
        self._shim.occupancy_take(self._capsule, self._table, lo, hi)

    def release(self, lo: int) -> None:
        """Mark the range that starts at ``lo`` free."""
        self._shim.occupancy_release(self._capsule, self._table, lo)

    def ranges(self) -> list[tuple[int, int]]:
        """The live ranges ``(lo, hi)``, by ``lo``."""
        return [(int(lo), int(hi)) for lo, hi in
                self._shim.occupancy_ranges(self._capsule, self._table)]


class _HookedLock:
    """The plans' lock, pausing the server (and booking what it did) as it is taken and arming
    it again as it is released, outermost only."""

    __slots__ = ("_depth", "_lock", "_server")

    def __init__(self, lock: Any, server: NativeServing) -> None:
        self._lock, self._server, self._depth = lock, server, 0

    def __enter__(self) -> bool:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            try:
                self._server.catch_up()
            except BaseException:
                self._depth -= 1
                self._lock.release()
                raise
        return True

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if self._depth == 1:
                self._server.arm()
        finally:
            self._depth -= 1
            self._lock.release()


class NativeServing:
    """A server of ``plans``' slots on a torch CPU route (module docstring).

    ``shim`` is the compiled shim (:func:`tensorarena.interop.torch_cpu_shim.extension`) and
    ``route`` the route's capsule.
    """

    def __init__(self, plans: LearnedPlans, shim: Any, route: Any) -> None:
        self._plans, self._shim = plans, shim
        server = weakref.ref(self)  # the route holds the callback: no cycle through C

        def book() -> None:
            found = server()
            if found is not None:
                with found._lock:  # booked as the lock is taken
                    pass

        self._capsule = shim.serving_attach(route, book)
        self._tables: dict[int, StepPlan] = {}  # by table id
        self._ids: dict[int, int] = {}  # id(plan) -> table id, for the plans in _tables
        self._retired: set[int] = set()
        self._next = 1
        self._closed = False
        self._left = (0, 0)  # live bytes and blocks as the server was left
        self._lock = plans._serve_natively(lambda lock: _HookedLock(lock, self),
                                           self._new_recorder)

    @property
    def served(self) -> int:
        """Allocations served by the server, with no Python call, so far."""
        return int(self._shim.serving_counts(self._capsule)[0])

    @property
    def freed(self) -> int:
        """Blocks the server gave that were freed there, with no Python call, so far."""
        return int(self._shim.serving_counts(self._capsule)[1])

    def close(self) -> None:
        """Serve nothing more (the plans' own calls serve instead); blocks already given are
        still freed into their ranges and booked at once."""
        with self._lock:
            self._closed = True
            self._shim.serving_close(self._capsule)

    # --- the lock's hooks ---------------------------------------------------------------------

    def catch_up(self) -> None:
        """Pause the server and book what it did since it was left."""
        booked = self._shim.serving_pause(self._capsule)
        if booked is not None:
            self._plans._book_native(booked, self._tables, *self._left)

    def arm(self) -> None:
        """Leave the server where the plans stand (serving from there if it may); forget
        plans that went."""
        shim, capsule = self._shim, self._capsule
        for table, held in list(self._tables.items()):
            if not held.retired:
                continue
            if held.base is None:  # its arena went back: no block of it lives
                shim.serving_drop(capsule, table)
                held.occupancy = Occupancy()
                del self._tables[table], self._ids[id(held)]
                self._retired.discard(table)
            elif table not in self._retired:
                shim.serving_retire(capsule, table)
                self._retired.add(table)
        while True:
            plan, position, live, count = self._plans._native_state()
            table = 0
            if plan is not None and not self._closed:
                found = self._ids.get(id(plan))
                table = self._register(plan) if found is None else found
            self._left = (live, count)
            if shim.serving_leave(capsule, table, position):
                return
            self.catch_up()  # frees that came while the plans ran: booked here first

    def _new_recorder(self) -> NativeRecorder:
        """The log of the step that begins (the plans' recorder), shared with the server."""
        recorder = NativeRecorder(self._shim)
        self._shim.serving_log(self._capsule, recorder.log)
        return recorder

    def _register(self, plan: StepPlan) -> int:
        table, self._next = self._next, self._next + 1
        shim, capsule = self._shim, self._capsule
        assert plan.base is not None
        offsets = array("Q", (NO_SLOT if o is None else o for o in plan.offsets))
        shim.serving_table(capsule, table, array("Q", plan.sizes), offsets, plan.base)
        for lo, hi in plan.occupancy.ranges():
            shim.occupancy_take(capsule, table, lo, hi)
        plan.occupancy = NativeOccupancy(shim, capsule, table)
        self._tables[table] = plan
        self._ids[id(plan)] = table
        return table

    def __repr__(self) -> str:
        served, freed = self._shim.serving_counts(self._capsule)
        return (f"NativeServing(tables={len(self._tables)}, served={served}, freed={freed}"
                f"{', closed' if self._closed else ''})")
