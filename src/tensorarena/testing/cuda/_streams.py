"""Streams, events and the seeded scheduler that runs their queued work.

Work on a stream is an :class:`Op` queued in stream order; nothing runs when it is queued. The
:class:`Scheduler` runs the head of a *ready* stream (one whose head's dependencies are met),
chosen by a seeded ``random.Random``, a few steps after every call and as many as needed at a
synchronisation point, so the same program and seed give the same interleaving and a different
seed gives another legal one.

Ordering is tracked with vector clocks: each op carries, per stream, the last op of that stream
known to finish before it (through stream order, events waited on, or the legacy default
stream's implicit synchronisation with blocking streams). Work the host has seen finish
(``cudaStreamSynchronize``, a successful ``cudaEventQuery``...) is ordered before everything
queued later. An op that touches bytes another stream's op also touches, one of them writing,
with neither ordered before the other, is a :class:`Race`, whatever order the scheduler happens
to pick: a race is found from the program, not from luck.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Op", "Race", "Scheduler", "SimEvent", "SimStream"]

Range = tuple[int, int]  # (address, nbytes)


@dataclass(frozen=True)
class Race:
    """Two unordered accesses to the same bytes, at least one a write."""

    address: int
    nbytes: int
    first: str
    second: str

    def __str__(self) -> str:
        return f"race on {self.nbytes} bytes at {self.address:#x}: {self.first} vs {self.second}"


@dataclass(eq=False)
class Op:
    """One piece of queued work: ``run`` is called when the scheduler reaches it."""

    what: str
    run: Callable[[], None] | None = None
    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()
    after: dict[SimStream, int] = field(default_factory=dict)  # must finish first
    clock: dict[SimStream, int] = field(default_factory=dict)
    stream: SimStream | None = None
    seq: int = 0

    def __str__(self) -> str:
        where = f"stream {self.stream.handle:#x}" if self.stream is not None else "host"
        return f"{self.what} on {where}"


class SimStream:
    """A stream of one device: ``blocking`` streams synchronise with the legacy default one."""

    def __init__(self, handle: int, device: int, *, blocking: bool, legacy: bool = False) -> None:
        self.handle = handle
        self.device = device
        self.blocking = blocking
        self.legacy = legacy
        self.queue: deque[Op] = deque()
        self.queued = 0  # ops ever queued (the last one's seq)
        self.done = 0  # ops finished
        self.seen = 0  # ops the host knows finished
        self.clock: dict[SimStream, int] = {}
        self.history: list[Op] = []  # queued ops the host has not seen finish
        self.held = False

    def __repr__(self) -> str:
        return f"SimStream({self.handle:#x}, device={self.device}, queued={len(self.queue)})"


class SimEvent:
    """An event of one device; ``mark`` is the stream position it was last recorded at."""

    def __init__(self, handle: int, device: int) -> None:
        self.handle = handle
        self.device = device
        self.mark: tuple[SimStream, int, dict[SimStream, int]] | None = None

    def reached(self) -> bool:
        """True once the recorded position has run (an unrecorded event counts as reached)."""
        return self.mark is None or self.mark[0].done >= self.mark[1]


def _overlap(a: Range, b: Range) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def _merge(clock: dict[SimStream, int], other: dict[SimStream, int]) -> None:
    for stream, seq in other.items():
        if clock.get(stream, 0) < seq:
            clock[stream] = seq


class Scheduler:
    """Every stream's queue, and the seeded choice of which ready stream runs next."""

    def __init__(self, seed: int, on_fault: Callable[[int], None]) -> None:
        self.random = random.Random(seed)
        self.streams: list[SimStream] = []
        self.races: list[Race] = []
        self._on_fault = on_fault

    # --- queueing ------------------------------------------------------------------------------

    def enqueue(self, stream: SimStream, op: Op, legacy: SimStream | None = None,
                inherited: dict[SimStream, int] | None = None) -> Op:
        """Queue ``op`` on ``stream``, with the implicit legacy-stream ordering and the clock
        of an event it waits for (``inherited``), and check it against every unordered access
        of other streams."""
        clock = dict(stream.clock)
        _merge(clock, op.after)
        if inherited:
            _merge(clock, inherited)
        if stream.legacy:  # waits for every blocking stream of its device
            for other in self.streams:
                if other.device == stream.device and other.blocking and other.queued:
                    op.after[other] = other.queued
                    _merge(clock, other.clock)
        elif stream.blocking and legacy is not None and legacy.queued:
            op.after[legacy] = legacy.queued
            _merge(clock, legacy.clock)
        stream.queued += 1
        op.stream, op.seq = stream, stream.queued
        clock[stream] = op.seq
        op.clock = clock
        self.check_races(op, (op.reads, op.writes), clock)
        stream.clock = clock
        stream.queue.append(op)
        if op.reads or op.writes:
            stream.history.append(op)
        return op

    def check_races(self, op: Op | str, ranges: tuple[Iterable[Range], Iterable[Range]],
                    clock: dict[SimStream, int]) -> None:
        """Record a race for each access of ``op`` that conflicts with an unordered one."""
        reads, writes = tuple(ranges[0]), tuple(ranges[1])
        if not reads and not writes:
            return
        own = op.stream if isinstance(op, Op) else None
        for other in self.streams:
            if other is own:
                continue
            horizon = max(clock.get(other, 0), other.seen)
            for earlier in other.history:
                if earlier.seq <= horizon:
                    continue
                for mine, theirs in ((writes, earlier.reads + earlier.writes),
                                     (reads, earlier.writes)):
                    for a in mine:
                        for b in theirs:
                            if _overlap(a, b):
                                start = max(a[0], b[0])
                                end = min(a[0] + a[1], b[0] + b[1])
                                self.races.append(Race(start, end - start, str(earlier), str(op)))

    # --- running -------------------------------------------------------------------------------

    def _ready(self) -> list[SimStream]:
        return [
            s for s in self.streams
            if s.queue and not s.held
            and all(other.done >= seq for other, seq in s.queue[0].after.items())
        ]

    def step(self) -> bool:
        """Run one ready op (seeded choice); False when none is ready."""
        ready = self._ready()
        if not ready:
            return False
        stream = ready[self.random.randrange(len(ready))] if len(ready) > 1 else ready[0]
        op = stream.queue.popleft()
        if op.run is not None:
            try:
                op.run()
            except MemoryError:  # an illegal address: the device's context is poisoned
                self._on_fault(stream.device)
        stream.done += 1
        return True

    def wander(self) -> None:
        """Run a seeded handful of ready ops: what the GPU got done while the host went on."""
        for _ in range(self.random.randrange(3)):
            if not self.step():
                return

    def run_until(self, finished: Callable[[], bool]) -> bool:
        """Run ops until ``finished()``; False if it cannot happen (a held stream)."""
        while not finished():
            if not self.step():
                return False
        return True

    def seen(self, stream: SimStream, seq: int, clock: dict[SimStream, int] | None = None) -> None:
        """The host knows ``stream`` ran its first ``seq`` ops, and whatever they waited for
        (``clock``: the clock at that point, when the caller has it)."""
        marks = {stream: seq}
        if clock:
            _merge(marks, clock)
        if seq == stream.queued:
            _merge(marks, stream.clock)
        for other, upto in marks.items():
            if upto > other.seen:
                other.seen = upto
                other.history = [op for op in other.history if op.seq > upto]
