"""``LearnedPlans``: a resource that plans a repeating step from its first run and serves the
later runs from one planned arena.

A training step, a decode step or a fixed-shape request allocates the same sizes in the same
order every time. The first run of a step is *recorded* (sizes, alignments, order, lifetimes on
a logical clock; :mod:`~tensorarena.learned.recording`) and served by a dynamic pool (the
fallback memory of :mod:`~tensorarena.learned.fallback`). At the step marker
(:meth:`LearnedPlans.step`, or leaving :meth:`LearnedPlans.step_scope`) the recording is
planned by :mod:`tensorarena.planning` under a node budget (the same plan on any machine),
and every later step whose first allocations have
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
* **Blocks carried into the next step.** A training loop's gradients are made in the backward
  pass and freed by the next step's ``zero_grad``: at the marker they outlive their step, so
  the first plan has no slot for them and the pool holds them beside a full arena. When the
  next step repeats the recording, the pattern is planned again *cyclically*, from a cut after
  the last of those frees (:meth:`~tensorarena.learned.recording.StepRecording.rotated`):
  from the third step on the gradients have slots too and the arena is the whole footprint.
  Where that cut falls inside the step (``zero_grad`` between the forward and the backward
  pass), the activations live across it and would have none: the step is also planned with
  the carried blocks held all step, and with their lifetimes wrapped around the marker (two
  pieces pinned at one offset, :mod:`~tensorarena.learned.wrapped`: their bytes serve the
  backward pass's temporaries between their free and their next birth), and the plan with the
  lower footprint is kept. A plan's first step that frees them mid-step but differs from the
  recorded step (which made an optimizer's state) is planned so at once, its own carried
  blocks guessed (the same sizes as those it freed), the guess checked at the next marker:
  the step after it is served from the plan, not the pool beside a new arena.
  A step that frees them before it allocates (``zero_grad`` first in the step) does not wait:
  a new plan does not serve it (the pool does, for the reason ``carried_blocks``: served from
  the arena, the step would hold the arena and the pool's copy of its new gradients at once,
  more than a pool), and the plan's recording, cut after those frees, is planned cyclically
  at the step's marker, whatever the step itself made (an optimizer's state, made once).
* **Memory back to the system.** At every marker after a plan exists, the pool gives its empty
  arenas back (``trim()``), and again before a plan takes its arena, so the steady state does
  not carry the first step's pool. What outlives the first step (an optimizer's state, made
  among that step's temporaries) costs about its own bytes: the pool is segregated, a large
  block in a region of its own and small ones in small arenas by class of size
  (:mod:`~tensorarena.learned.fallback`), so that no lasting block pins an arena the step's
  temporaries filled. :meth:`LearnedPlans.report` gives the peak reserved since the last new
  plan began to serve (the steady state) apart from the whole run's.
* **Without markers** (``detect_steps=True``): the steps are found by
  :class:`~tensorarena.learned.step_finder.StepFinder` and planned from the last period seen,
  so a trace can be replayed with no markers (``tensorarena replay --strategy learned``).
* **Threads.** One re-entrant lock around every call: allocations from many threads are
  correct (each served or fallen back, never aliased); a step's order is then whatever order
  the threads took the lock in, which matches the recording only if the program's is stable.

Every error is raised before any state changes: a zero or bad size, a bad alignment, a double
free, a foreign address, a size mismatch (the errors of :mod:`tensorarena.errors`). An
allocation the pool refuses (out of memory) leaves the step where it was; only a detector that
finds steps without markers has seen it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tensorarena.adaptors.counting import Counting
from tensorarena.core.registry import StrategySpec
from tensorarena.errors import (
    InvalidAddressError,
    InvalidArgumentError,
    ResourceClosedError,
    SizeMismatchError,
)
from tensorarena.learned._learned_statistics import LearnedStatistics
from tensorarena.learned._native_booking import LiveBlock, NativeBooking
from tensorarena.learned._step_boundaries import StepBoundaries
from tensorarena.learned.fallback import SegregatedFallback
from tensorarena.learned.period import PeriodDetector
from tensorarena.learned.plan_cache import PlanCache
from tensorarena.learned.recording import FinishedStep
from tensorarena.learned.report import FallbackReason
from tensorarena.learned.step_finder import StepFinder
from tensorarena.learned.step_plan import StepCursor, StepPlan
from tensorarena.memory.host import HostMemory
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

__all__ = ["DEFAULT_LEARNED_NODE_LIMIT", "LearnedPlans"]

#: Exact-search nodes per plan by default: the heuristics reach the lower bound on the steps
#: recorded so far, and the search rarely needs more; a budget, not a clock, so the plan is the
#: same on any machine.
DEFAULT_LEARNED_NODE_LIMIT = 10_000


def _positive(value: object, name: str) -> int:
    if type(value) is not int or value < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
    return value


class LearnedPlans(LearnedStatistics, NativeBooking, StepBoundaries):
    """A resource that learns a plan from the first run of a repeating step (module docstring).

    ``upstream`` gives the bytes (default :class:`~tensorarena.memory.HostMemory`): the arenas
    in one piece each, and the fallback memory's regions and small arenas (``strategy``: the
    small arenas' placement, default best fit). ``max_patterns`` plans at most, looked up by
    the sizes of a step's first ``key_length`` allocations; ``lookahead`` bounds how far a
    step may stray from its recording's order and still be served. ``node_limit`` is the
    planner's budget per plan. ``detect_steps=True`` finds the steps without markers, with
    ``period_detector`` (default ``PeriodDetector(max_period=65536)``: its options bound and
    tune the search).
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
        period_detector: PeriodDetector | None = None,
    ) -> None:
        upstream = HostMemory() if upstream is None else check_resource(upstream)
        if node_limit is not None:
            _positive(node_limit, "node_limit")
        if type(detect_steps) is not bool:
            raise InvalidArgumentError(f"detect_steps must be a bool, got {detect_steps!r}")
        self._upstream = upstream
        self._meter = Counting(upstream)  # what is held from the upstream: reserved bytes
        self._plans = PlanCache(self._meter, max_patterns=_positive(max_patterns,
                                                                    "max_patterns"),
                                key_length=_positive(key_length, "key_length"),
                                node_limit=node_limit)
        self._lookahead = _positive(lookahead, "lookahead")
        if period_detector is None:
            period_detector = PeriodDetector(max_period=1 << 16)
        elif not isinstance(period_detector, PeriodDetector):
            raise InvalidArgumentError(
                f"period_detector must be a PeriodDetector, got {period_detector!r}")
        self._finder = StepFinder(period_detector) if detect_steps else None
        self._pool = SegregatedFallback(self._meter, strategy=strategy)
        self._lock = threading.RLock()
        self._closed = False
        self._blocks: dict[int, LiveBlock] = {}
        # The step in progress.
        self._serial = 0
        self._recorder = self._new_recorder()
        self._observed: list[int] = []  # sizes of its first key_length allocations
        self._cursor: StepCursor | None = None
        self._unknown = False  # no plan serves it (chosen from its first allocations)
        self._unserved = FallbackReason.UNKNOWN_PATTERN  # why, then
        self._step_served = 0
        self._previous: FinishedStep | None = None  # the last step, if learned
        self._carried: set[int] = set()  # its blocks freed in this step
        self._cut = 0  # allocations of this step before the last of those frees
        # Counters.
        self._live_bytes = self._peak_live = self._total_bytes = 0
        self._peak_blocks = self._allocations = 0
        self._served = self._out_of_order = self._steps = 0
        self._fallbacks = dict.fromkeys(FallbackReason, 0)
        # Reserved bytes: the meter's peak since the steady state began (a plan's first step),
        # and the highest peak before that.
        self._peak_before = 0
        self._steady = False

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
        return self._finder is not None

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
            finder = self._finder
            if finder is not None:
                self._find_steps(finder, nbytes)
            recorder = self._recorder
            position = len(recorder)
            before = (self._cursor, self._unknown, self._unserved)
            if position < self._plans.key_length and not self._unknown:
                self._choose(nbytes, position)
            cursor = self._cursor
            if cursor is None:
                matched: tuple[int, bool] | FallbackReason = self._unserved
            else:
                saved = cursor.save()
                matched = cursor.match(nbytes, alignment)
            plan: StepPlan | None
            if type(matched) is tuple:
                assert cursor is not None
                slot, reordered = matched
                plan = cursor.plan
                offset = plan.offsets[slot]
                assert offset is not None and plan.base is not None
                plan.occupancy.take(offset, offset + nbytes)
                address = plan.base + offset
                self._served += 1
                self._step_served += 1
                if reordered:
                    self._out_of_order += 1
            else:
                try:
                    address = self._pool.allocate(nbytes, alignment)
                except BaseException:  # the step is where it was (an arena taken stays)
                    if cursor is not None:
                        cursor.restore(saved)
                    self._cursor, self._unknown, self._unserved = before
                    del self._observed[position:]
                    raise
                self._fallbacks[matched] += 1  # type: ignore[index]
                plan, offset = None, 0
            number = recorder.allocated(nbytes, alignment)
            if finder is None:
                self._blocks[address] = LiveBlock(nbytes, plan, offset, self._serial, number)
            else:
                self._blocks[address] = LiveBlock(nbytes, plan, offset, self._serial, number,
                                               finder.epoch, finder.log(nbytes, alignment))
            self._allocations += 1
            live = self._live_bytes + nbytes
            self._live_bytes = live
            self._total_bytes += nbytes
            if live > self._peak_live:
                self._peak_live = live
            if len(self._blocks) > self._peak_blocks:
                self._peak_blocks = len(self._blocks)
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
                self._plans.freed_from(plan)
            del self._blocks[address]
            self._live_bytes -= nbytes
            if block.serial == self._serial:
                self._recorder.freed(block.number)
            elif block.serial == self._serial - 1 and self._previous is not None:
                self._carried.add(block.number)
                self._cut = len(self._recorder)
            if self._finder is not None:
                self._finder.freed(block.epoch, block.history)

    # --- steps -------------------------------------------------------------------------------

    def step(self, *, failed: bool = False) -> None:
        """Mark the end of a step (and the start of the next). The first step of a pattern is
        planned here; ``failed=True`` (a step that raised halfway) learns nothing from it.
        A marker right after another (no allocation between) does nothing."""
        if type(failed) is not bool:
            raise InvalidArgumentError(f"failed must be a bool, got {failed!r}")
        with self._lock:
            if self._finder is not None:
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

    # --- memory back, statistics ---------------------------------------------------------------

    def close(self) -> None:
        """Take no new requests; give back every arena and pool arena as soon as it holds no
        live block (now, for those that hold none)."""
        with self._lock:
            self._closed = True
            self._plans.retire_all()
            self._pool.close()

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return {address: block.nbytes for address, block in self._blocks.items()}

    def __len__(self) -> int:
        with self._lock:  # a native server's blocks are booked as the lock is taken
            return len(self._blocks)

    def __repr__(self) -> str:
        mode = "markers" if self._finder is None else "detect_steps"
        return (f"LearnedPlans(upstream={type(self._upstream).__name__}, {mode}, "
                f"plans={len(self._plans)}, steps={self._steps}, live={len(self._blocks)}, "
                f"arenas={format_size(self._plans.arena_bytes)}, served={self._served}, "
                f"fell_back={sum(self._fallbacks.values())})")

    def _not_live(self, address: int) -> InvalidAddressError:
        error = self._plans.not_live(address)
        if error is not None:
            return error
        try:
            self._pool.size_of(address)  # not live here: raises the pool's precise error
        except InvalidAddressError as exc:
            return exc
        return InvalidAddressError(  # pragma: no cover - every pool block is in _blocks
            f"address {address:#x} is not a live block of this LearnedPlans", address=address)
