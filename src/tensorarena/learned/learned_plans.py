"""``LearnedPlans``: a resource that plans a repeating step from its first run and serves the
later runs from one planned arena.

A training step, a decode step or a fixed-shape request allocates the same sizes in the same
order every time. The first run of a step is *recorded* (sizes, alignments, order, lifetimes on
a logical clock; :mod:`~tensorarena.learned.recording`) and served by a dynamic
:class:`~tensorarena.memory.Pool`. At the step marker (:meth:`LearnedPlans.step`, or leaving
:meth:`LearnedPlans.step_scope`) the recording is planned by :mod:`tensorarena.planning` under a
node budget (the same plan on any machine), and every later step whose first allocations have
the recorded sizes is served from one arena taken from the upstream in one piece: the i-th
allocation gets its planned offset when its size matches (the matching rule and the
never-alias rule: :mod:`~tensorarena.learned.step_plan`). Whatever cannot be served from a slot
falls back to the pool, for one reason that :meth:`LearnedPlans.report` counts.

Design choices, and what they cost:

* **Plans by pattern.** At most ``max_patterns`` plans, keyed by the sizes of a step's first
  ``key_length`` allocations; the plan is chosen (most recently used first) as those arrive.
  A step that matches none is served by the pool and learned at its marker while fewer than
  ``max_patterns`` plans are held; once they are, only a pattern that recurs (its key was seen
  unplanned before) is learned, so a one-off step does not push out a plan in use. The least
  recently used plan makes room, preferring one whose arena holds no live block. An evicted
  plan's arena goes back to the upstream when its last block is freed, never before.
* **Re-learning.** A step whose recording differs from its plan's (sizes, or which blocks
  outlived the step) is remembered; when the next step of that pattern differs the same way,
  the pattern is planned again from it. A first step that makes lasting state (an optimizer's)
  is thus replaced by the steady step after two more steps, and a step that differs once is not
  planned at all.
* **Memory back to the system.** At every marker after a plan exists, the pool gives its empty
  arenas back (``trim()``), so the steady state does not carry the first step's pool; a block
  that outlived its step keeps only its own pool arena.
* **Without markers** (``detect_steps=True``): the steps are found by
  :class:`~tensorarena.learned.period.PeriodDetector` and planned from the last period seen, so
  a trace can be replayed with no markers (``tensorarena replay --strategy learned``). A step
  that a plan serves less than half of, three times in a row, means the period was wrong:
  detection goes on from the history it kept, never offering that period again.
* **Threads.** One re-entrant lock around every call: allocations from many threads are
  correct (each served or fallen back, never aliased); a step's order is then whatever order
  the threads took the lock in, which matches the recording only if the program's is stable.

Every error is raised before any state changes: a zero or bad size, a bad alignment, a double
free, a foreign address, a size mismatch (the errors of :mod:`tensorarena.errors`).
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

from tensorarena.adaptors.counting import Counting
from tensorarena.core.registry import StrategySpec
from tensorarena.debug import check
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    ResourceClosedError,
    SizeMismatchError,
)
from tensorarena.learned.period import Period, PeriodDetector
from tensorarena.learned.recording import Recorder, StepRecording
from tensorarena.learned.report import FallbackReason, LearnedPlansReport, PlanSummary
from tensorarena.learned.step_plan import StepCursor, StepPlan
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryKind,
    MemoryResource,
    Stream,
    check_resource,
)
from tensorarena.sizes import (
    ALIGNMENTS,
    MAX_SIZE,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
)
from tensorarena.stats import Count, MemoryStatistics

__all__ = ["DEFAULT_LEARNED_NODE_LIMIT", "LearnedPlans"]

#: Exact-search nodes per plan by default: the heuristics reach the lower bound on the steps
#: recorded so far, and the search rarely needs more; a budget, not a clock, so the plan is the
#: same on any machine.
DEFAULT_LEARNED_NODE_LIMIT = 10_000

#: Without markers, the period is given up after this many steps in a row that a plan served
#: less than half of: one step to notice a difference, one to re-learn from, one to fail again.
_LOSE_AFTER = 3


class _Block(NamedTuple):
    nbytes: int
    plan: StepPlan | None  #: None: the block is in the pool
    offset: int  #: in the plan's arena
    serial: int  #: the step it was allocated in
    number: int  #: its number in that step's recording
    epoch: int = -1  #: without markers: the history it is logged in
    history: int = -1  #: its number in that history


def _positive(value: object, name: str) -> int:
    if type(value) is not int or value < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
    return value


class LearnedPlans:
    """A resource that learns a plan from the first run of a repeating step (module docstring).

    ``upstream`` gives the bytes (default :class:`~tensorarena.memory.HostMemory`): the arenas
    in one piece each, and the dynamic pool's arenas (``strategy``, default best fit, default
    growth). ``node_limit`` is the planner's budget per plan. ``detect_steps=True`` finds the
    steps without markers (``min_period``/``max_period`` bound the step's allocations).
    """

    def __init__(
        self,
        upstream: MemoryResource | None = None,
        *,
        max_patterns: int = 4,
        key_length: int = 4,
        lookahead: int = 16,
        node_limit: int | None = DEFAULT_LEARNED_NODE_LIMIT,
        strategy: StrategySpec = "best_fit",
        detect_steps: bool = False,
        min_period: int = 2,
        max_period: int = 1 << 16,
        base_window: int = 1024,
    ) -> None:
        upstream = HostMemory() if upstream is None else check_resource(upstream)
        self._max_patterns = _positive(max_patterns, "max_patterns")
        self._key_length = _positive(key_length, "key_length")
        self._lookahead = _positive(lookahead, "lookahead")
        if node_limit is not None:
            _positive(node_limit, "node_limit")
        if type(detect_steps) is not bool:
            raise InvalidArgumentError(f"detect_steps must be a bool, got {detect_steps!r}")
        self._node_limit = node_limit
        self._upstream = upstream
        self._meter = Counting(upstream)  # what is held from the upstream, for reserved bytes
        self._pool = Pool(self._meter, strategy=strategy, initial_size=0, thread_safe=False)
        self._lock = threading.RLock()
        self._closed = False
        self._plans: OrderedDict[tuple[int, ...], StepPlan] = OrderedDict()  # LRU first
        self._retired: list[StepPlan] = []  # arenas that go back when their last block does
        self._unplanned: OrderedDict[tuple[int, ...], None] = OrderedDict()  # keys seen once
        self._blocks: dict[int, _Block] = {}
        # The step in progress.
        self._serial = 0
        self._recorder = Recorder()
        self._observed: list[int] = []  # sizes of its first key_length allocations
        self._cursor: StepCursor | None = None
        self._unknown = False  # no plan matched its first allocations
        self._no_arena = False
        self._step_served = 0
        # Without markers.
        self._detect = detect_steps
        self._detector = PeriodDetector(min_period=min_period, max_period=max_period,
                                        base_window=base_window)
        self._history = Recorder()  # every allocation since detection started, never per step
        self._epoch = 0  # how many times the history started again
        self._period: Period | None = None
        self._boundary = 0  # the history number of the next step's first allocation
        self._partial = False  # the step in progress began before its period was known
        self._bad_steps = 0  # steps in a row that a plan served less than half of
        # Counters.
        self._live_bytes = self._peak_live = self._total_bytes = 0
        self._peak_blocks = self._allocations = 0
        self._served = self._out_of_order = 0
        self._fallbacks = dict.fromkeys(FallbackReason, 0)
        self._steps = self._learned = self._evicted = 0
        self._arena_bytes = 0
        self._peak_before_steady: int | None = None  # None: no plan has served yet

    # --- properties --------------------------------------------------------------------------

    @property
    def upstream(self) -> MemoryResource:
        """Where the arenas and the dynamic pool's memory come from."""
        return self._upstream

    @property
    def memory_kind(self) -> MemoryKind:
        """The upstream's kind."""
        return self._upstream.memory_kind

    @property
    def detect_steps(self) -> bool:
        """True if the steps are found without markers."""
        return self._detect

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Return ``nbytes`` bytes aligned to ``alignment``: a planned slot when the step
        repeats its recording there, else from the dynamic pool."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment not in ALIGNMENTS:
            alignment = check_alignment(alignment)
        with self._lock:
            if self._closed:
                raise ResourceClosedError(f"this LearnedPlans was closed ({self!r})")
            if self._detect:
                self._find_steps(nbytes)
                history = self._history.allocated(nbytes, alignment)
            position = len(self._recorder)
            if position < self._key_length and not self._unknown:
                self._choose(nbytes, position)
            cursor = self._cursor
            if cursor is None:
                reason = (FallbackReason.NO_ARENA if self._no_arena
                          else FallbackReason.UNKNOWN_PATTERN)
                matched: tuple[int, bool] | FallbackReason = reason
            else:
                saved = cursor.save()
                matched = cursor.match(nbytes, alignment)
            if isinstance(matched, FallbackReason):
                try:
                    address = self._pool.allocate(nbytes, alignment)
                except BaseException:
                    if cursor is not None:
                        cursor.restore(saved)
                    raise
                self._fallbacks[matched] += 1
                block = _Block(nbytes, None, 0, self._serial, 0)
            else:
                assert cursor is not None
                plan, (slot, reordered) = cursor.plan, matched
                offset = plan.offsets[slot]
                assert offset is not None and plan.base is not None
                plan.occupancy.take(offset, offset + nbytes)
                address = plan.base + offset
                self._served += 1
                self._step_served += 1
                self._out_of_order += reordered
                block = _Block(nbytes, plan, offset, self._serial, 0)
            block = block._replace(number=self._recorder.allocated(nbytes, alignment))
            if self._detect:
                block = block._replace(epoch=self._epoch, history=history)
            self._blocks[address] = block
            self._allocations += 1
            self._live_bytes += nbytes
            self._total_bytes += nbytes
            self._peak_live = max(self._peak_live, self._live_bytes)
            self._peak_blocks = max(self._peak_blocks, len(self._blocks))
            return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Give back the block at ``address`` to where it came from (its arena or the pool).

        Raises :class:`DoubleFreeError`, :class:`InvalidAddressError` or
        :class:`SizeMismatchError`, changing nothing.
        """
        with self._lock:
            block = self._blocks.get(address) if type(address) is int else None
            if block is None:
                address = check_address(address)
                block = self._blocks.get(address)
                if block is None:
                    raise self._not_live(address)
            if type(nbytes) is not int:
                nbytes = check_nbytes(nbytes)
            if nbytes != block.nbytes:
                raise SizeMismatchError(
                    f"block {address:#x} was allocated with {block.nbytes} bytes, freed with "
                    f"{nbytes}", address=address, given=nbytes, allocated=block.nbytes)
            plan = block.plan
            if plan is None:
                self._pool.deallocate(address, nbytes)
            else:
                plan.occupancy.release(block.offset)
                if plan.retired and not len(plan.occupancy):
                    self._release_arena(plan)
            del self._blocks[address]
            self._live_bytes -= nbytes
            if block.serial == self._serial:
                self._recorder.freed(block.number)
            if block.epoch == self._epoch:
                self._history.freed(block.history)

    # --- steps -------------------------------------------------------------------------------

    def step(self, *, failed: bool = False) -> None:
        """Mark the end of a step (and the start of the next). The first step of a pattern is
        planned here; ``failed=True`` (a step that raised halfway) learns nothing from it.
        A marker right after another (no allocation between) does nothing."""
        if type(failed) is not bool:
            raise InvalidArgumentError(f"failed must be a bool, got {failed!r}")
        with self._lock:
            if self._detect:
                raise InvalidArgumentError(
                    "this LearnedPlans finds its steps itself (detect_steps=True): "
                    "make one with detect_steps=False to mark steps")
            if len(self._recorder):
                self._end_step(learn=not failed)

    @contextmanager
    def step_scope(self) -> Iterator[LearnedPlans]:
        """``with plans.step_scope():`` runs one step: a marker before and after it; a step
        that raises is ended with ``failed=True`` and the exception goes on."""
        self.step()
        try:
            yield self
        except BaseException:
            self.step(failed=True)
            raise
        self.step()

    def _end_step(self, *, learn: bool) -> None:
        cursor = self._cursor
        allocations = len(self._recorder)
        if learn:
            self._steps += 1
            recording = self._recorder.finish()
            if cursor is None:
                if not self._no_arena and self._recurred(recording):
                    self._learn(recording)
            else:
                cursor.plan.steps_served += 1
                self._relearn(cursor.plan, recording)
            if self._detect:
                bad = self._step_served * 2 < allocations
                self._bad_steps = self._bad_steps + 1 if bad else 0
                if self._bad_steps >= _LOSE_AFTER:
                    self._lose_period()
        if self._plans:
            self._pool.trim()
        self._begin_step()

    def _begin_step(self) -> None:
        self._serial += 1
        self._recorder = Recorder()
        self._observed = []
        self._cursor = None
        self._unknown = self._no_arena = False
        self._step_served = 0

    def _choose(self, nbytes: int, position: int) -> None:
        """Pick the plan for the step in progress from its first allocations."""
        observed = self._observed
        observed.append(nbytes)
        cursor = self._cursor
        if cursor is not None and cursor.plan.matches_prefix(observed):
            return
        plan = next((p for p in reversed(self._plans.values()) if p.matches_prefix(observed)),
                    None)
        if plan is None:
            self._cursor, self._unknown = None, True
            return
        if plan.base is None:
            try:
                plan.base = self._meter.allocate(max(plan.height, 1), plan.alignment)
            except MemoryError:
                self._cursor, self._unknown, self._no_arena = None, True, True
                return
            self._arena_bytes += max(plan.height, 1)
        if self._peak_before_steady is None:  # the first step a plan serves: steady from here
            self._peak_before_steady = self._meter.statistics().requested_bytes.peak
            self._meter.reset_peak_stats()
        self._plans.move_to_end(plan.key)
        self._cursor = StepCursor(plan, position, self._lookahead)

    def _recurred(self, recording: StepRecording) -> bool:
        """True if an unplanned step is to be learned: there is room, or its key came before."""
        key = recording.key(self._key_length)
        if len(self._plans) < self._max_patterns or key in self._unplanned:
            self._unplanned.pop(key, None)
            return True
        self._unplanned[key] = None
        while len(self._unplanned) > 4 * self._max_patterns:
            self._unplanned.popitem(last=False)
        return False

    def _learn(self, recording: StepRecording) -> None:
        """Plan ``recording`` and keep it, making room if ``max_patterns`` plans are held."""
        if not len(recording):
            return
        plan = StepPlan(recording, key_length=self._key_length, node_limit=self._node_limit)
        if not plan.planned:
            return
        old = self._plans.pop(plan.key, None)
        if old is not None:
            self._retire(old)
        while len(self._plans) >= self._max_patterns:
            victim = next((k for k, p in self._plans.items() if not len(p.occupancy)),
                          next(iter(self._plans)))
            self._retire(self._plans.pop(victim))
        self._plans[plan.key] = plan
        self._learned += 1

    def _relearn(self, plan: StepPlan, recording: StepRecording) -> None:
        """Plan the pattern again when two steps in a row differed from it the same way."""
        signature = recording.signature()
        if signature == plan.signature:
            plan.candidate = None
        elif signature == plan.candidate and recording.key(self._key_length) == plan.key:
            self._learn(recording)
        else:
            plan.candidate = signature

    def _retire(self, plan: StepPlan) -> None:
        plan.retired = True
        self._evicted += 1
        if len(plan.occupancy):
            self._retired.append(plan)
        else:
            self._release_arena(plan)

    def _release_arena(self, plan: StepPlan) -> None:
        if plan.base is not None:
            self._meter.deallocate(plan.base, max(plan.height, 1))
            self._arena_bytes -= max(plan.height, 1)
            plan.base = None
        if plan in self._retired:
            self._retired.remove(plan)

    # --- steps without markers ---------------------------------------------------------------

    def _find_steps(self, nbytes: int) -> None:
        """Before the next allocation: end a step at its boundary; look for the period while
        none is known, and plan the last whole period seen when it is found."""
        detector = self._detector
        if len(self._history) >= 4 * detector.max_period:  # bound what is kept: start again
            detector.reset()
            self._history = Recorder()
            self._epoch += 1
            self._period = None
            self._begin_step()
        index = len(self._history)
        period = self._period
        if period is not None and index == self._boundary:
            self._boundary += period.length
            partial, self._partial = self._partial, False
            self._end_step(learn=not partial)  # may lose the period: then look again
        found = detector.observe(nbytes, self._live_bytes, evaluate=self._period is None)
        if found is None or self._period is not None:
            return
        # Plan the last whole period before the boundary in the last period seen, then serve
        # from the next boundary (now, if this allocation is one).
        recorder = self._history
        boundary = found.next_boundary(index - found.length + 1)
        until = recorder.start_of(boundary) if boundary < index else recorder.clock
        self._learn(recorder.finish(boundary - found.length, boundary, until))
        self._period = found
        if boundary == index:
            self._begin_step()
            self._boundary = index + found.length
        else:
            self._partial = True
            self._boundary = boundary + found.length

    def _lose_period(self) -> None:
        """The steps stopped repeating the plan: never offer this period again."""
        if self._period is not None:
            self._detector.reject(self._period.length)
        self._period = None
        self._partial = False
        self._bad_steps = 0

    # --- memory back, statistics ---------------------------------------------------------------

    def close(self) -> None:
        """Take no new requests; give back every arena and pool arena as soon as it holds no
        live block (now, for those that hold none)."""
        with self._lock:
            self._closed = True
            for plan in list(self._plans.values()):
                self._retire(plan)
            self._plans.clear()
            self._pool.close()

    def report(self) -> LearnedPlansReport:
        """What happened so far: steps, plans, served and fallen back (by reason)."""
        with self._lock:
            held = self._meter.statistics().requested_bytes
            steady = None if self._peak_before_steady is None else held.peak
            fallbacks = {reason.value: n for reason, n in self._fallbacks.items()}
            plans = tuple(
                PlanSummary(key=p.key, allocations=len(p.sizes), planned=p.planned,
                            height=p.height, lower_bound=p.lower_bound, optimal=p.optimal,
                            planner=p.planner, steps_served=p.steps_served,
                            live_blocks=len(p.occupancy))
                for p in self._plans.values())
            return LearnedPlansReport(
                steps=self._steps, plans_learned=self._learned, plans_evicted=self._evicted,
                allocations=self._allocations, served=self._served,
                served_out_of_order=self._out_of_order, fell_back=sum(fallbacks.values()),
                **fallbacks, reserved_bytes=held.current,
                peak_reserved_bytes=max(held.peak, self._peak_before_steady or 0),
                steady_peak_reserved_bytes=steady, arena_bytes=self._arena_bytes,
                period=None if self._period is None else self._period.length, plans=plans)

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot in the vocabulary of :mod:`tensorarena.stats`: requested bytes
        are the callers' live blocks, reserved bytes what is held from the upstream."""
        with self._lock:
            held = self._meter.statistics()
            live = Count(self._live_bytes, self._peak_live, self._total_bytes)
            reserved = held.requested_bytes
            reserved = Count(reserved.current,
                             max(reserved.peak, self._peak_before_steady or 0), reserved.total)
            return MemoryStatistics(
                requested_bytes=live, allocated_bytes=live, active_bytes=live,
                reserved_bytes=reserved,
                allocations=Count(len(self._blocks), self._peak_blocks, self._allocations),
                segments=held.allocations,
                num_upstream_allocs=held.allocations.total,
                num_upstream_frees=held.allocations.freed)

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return {address: block.nbytes for address, block in self._blocks.items()}

    def __len__(self) -> int:
        return len(self._blocks)

    def __repr__(self) -> str:
        mode = "detect_steps" if self._detect else "markers"
        return (f"LearnedPlans(upstream={type(self._upstream).__name__}, {mode}, "
                f"plans={len(self._plans)}, steps={self._steps}, live={len(self._blocks)}, "
                f"arenas={format_size(self._arena_bytes)}, served={self._served}, "
                f"fell_back={sum(self._fallbacks.values())})")

    def _not_live(self, address: int) -> InvalidAddressError:
        for plan in [*self._plans.values(), *self._retired]:
            if plan.base is not None and plan.base <= address < plan.base + max(plan.height, 1):
                if address - plan.base in plan.offsets:
                    return DoubleFreeError(
                        f"address {address:#x} is a slot of a learned arena with no live "
                        "block: freed twice?", address=address)
                return InvalidAddressError(
                    f"address {address:#x} is inside a learned arena but no block starts "
                    "there", address=address)
        try:
            self._pool.size_of(address)
        except InvalidAddressError as exc:
            return exc
        return InvalidAddressError(f"address {address:#x} is not a live block of this "
                                   "LearnedPlans", address=address)  # pragma: no cover

    def _check_invariants(self) -> None:
        """Raise :class:`~tensorarena.errors.InvariantError` if a live block shares bytes with
        another, lies outside its arena, or the counts drift."""
        with self._lock:
            check(self._live_bytes == sum(b.nbytes for b in self._blocks.values()),
                  "live bytes drift")
            check(self._served + sum(self._fallbacks.values()) == self._allocations,
                  "served and fallen back do not add up")
            ranges = sorted((address, address + b.nbytes) for address, b in self._blocks.items())
            for (_, end), (start, _) in itertools.pairwise(ranges):
                check(end <= start, "two live blocks share bytes")
            for address, b in self._blocks.items():
                if b.plan is not None:
                    check(b.plan.base is not None and address == b.plan.base + b.offset
                          and b.offset + b.nbytes <= b.plan.height, "a block outside its arena")
            check(len(self._pool) == sum(b.plan is None for b in self._blocks.values()),
                  "pool blocks drift")
