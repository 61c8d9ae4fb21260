"""A growing pool: arenas taken from an upstream resource, carved up by a placement strategy.

``Pool`` is itself a resource (``allocate``/``deallocate``), so pools and adaptors nest: a pool
over mmap'd host memory, a pool over another pool, a thread cache in front of a pool.

How it works. The pool holds a list of :class:`~tensorarena.core.Arena` objects, each a region
taken from the upstream in one ``upstream.allocate`` call, each with its own strategy instance.
A request is tried in the arenas in the order they were made (which packs live blocks toward
the oldest arenas, so that the newest ones empty first and ``trim()`` can give them back). When
no arena can hold it, the growth policy (:mod:`tensorarena.memory.growth`) sizes a new arena,
never smaller than the request: a request larger than every arena gets an arena of its own
(growing and giving arenas back: :mod:`tensorarena.memory._pool_arenas`).
Finding the owner of a freed address is one dict lookup: the pool maps every live block's
address to its arena (the same map proves that an address is live).

Ownership (RMM's rule): a live block keeps its memory mapped. Nothing a user calls unmaps or
re-hands-out bytes that a live block holds:

* ``trim()`` gives back empty arenas only;
* ``close()`` (and leaving ``with Pool(...)``) gives back every empty arena now and each other
  arena when its last live block is freed — the unmapping is *deferred*, never forced — and the
  pool takes no new requests (:class:`~tensorarena.errors.ResourceClosedError`);
* ``reset()`` with live blocks refuses (:class:`~tensorarena.errors.ResourceInUseError`, naming
  how many blocks and bytes are live) unless told ``force=True``, which is unsafe by design:
  every live block's bytes may then be handed out again.

Threads. A pool is thread-safe by default: one re-entrant lock around every public method (a small
cost a call; ``tensorarena bench pool-pair`` measures it). ``thread_safe=False`` drops the lock
for callers that serialise access themselves (one thread, or a
:class:`~tensorarena.adaptors.ThreadCached` in front, which already serialises its upstream
calls). The unlocked pool runs the same methods, taking no lock (``_call_lock`` is None), not
methods bound on the instance (which a compiled native class could not have).

Statistics speak :mod:`tensorarena.stats` (*requested*, *allocated*, *reserved*; reported and
checked in :mod:`tensorarena.memory._pool_statistics`). Every error is raised before any state
changes; a failing upstream during growth leaves the pool exactly as it was.
"""

from __future__ import annotations

import threading
import weakref
from types import TracebackType

from tensorarena.core.arena import Arena
from tensorarena.core.registry import StrategySpec, strategy_factory
from tensorarena.debug import OFF, resolve_debug
from tensorarena.errors import (
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidSizeError,
    ResourceClosedError,
    ResourceInUseError,
)
from tensorarena.memory._pool_arenas import PoolArenas, release_arenas
from tensorarena.memory._pool_statistics import ArenaSnapshot, PoolStatistics
from tensorarena.memory.growth import GrowthPolicy, NextPowerOfTwo
from tensorarena.memory.pool_observers import ObservedPool, PoolObserver, register_pool
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
    Size,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)

__all__ = ["ArenaSnapshot", "Pool"]


class Pool(PoolArenas, PoolStatistics, ObservedPool):
    """A resource whose arenas come from ``upstream``, one placement strategy per arena.

    ``initial_size`` bytes are taken from the upstream at once (0: wait for the first request);
    whenever the pool holds nothing, its next arena is at least that large. ``growth`` sizes
    every further arena (default :class:`~tensorarena.memory.growth.NextPowerOfTwo`);
    ``maximum_size`` caps the bytes held from the upstream (at the cap, empty arenas are given
    back before a request fails). ``thread_safe`` (default True) guards every call with a lock.
    ``debug`` grades the invariant checks after every call (:mod:`tensorarena.debug`; ``None``
    reads the default when the pool is made).
    """

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        strategy: StrategySpec = "first_fit",
        growth: GrowthPolicy | None = None,
        initial_size: Size = "1MiB",
        maximum_size: Size | None = None,
        thread_safe: bool = True,
        debug: int | bool | None = None,
    ) -> None:
        upstream = check_resource(upstream)
        growth = NextPowerOfTwo() if growth is None else growth
        if isinstance(growth, type) or not callable(getattr(growth, "next_size", None)):
            raise InvalidArgumentError(
                f"growth must be a growth policy instance (Fixed(), SameAsRequested(), "
                f"NextPowerOfTwo(), Doubling(...)), not {growth!r}"
            )
        initial = parse_size(initial_size, name="initial_size", allow_zero=True)
        maximum = None if maximum_size is None else parse_size(maximum_size, name="maximum_size")
        if maximum is not None and initial > maximum:
            raise InvalidSizeError(
                f"initial_size {format_size(initial)} exceeds maximum_size {format_size(maximum)}"
            )
        if type(thread_safe) is not bool:
            raise InvalidArgumentError(f"thread_safe must be a bool, got {thread_safe!r}")
        self._upstream = upstream
        self._factory = strategy_factory(strategy)
        self._strategy_name: str = getattr(strategy, "name", str(strategy))
        self._growth = growth
        self._initial = initial
        self._maximum = maximum
        self._debug = resolve_debug(debug)
        self._lock = threading.RLock()
        self._thread_safe = thread_safe
        # allocate/deallocate take _call_lock: None when the caller serialises.
        self._call_lock: threading.RLock | None = self._lock if thread_safe else None
        self._observers: tuple[PoolObserver, ...] = ()  # see add_observer
        self._observer: PoolObserver | None = None  # what the calls tell: None, one, a fan-out
        self._history: PoolObserver | None = None  # the one _set_observer installed
        self._closed = False
        self._arenas: list[Arena] = []  # in creation order: the order requests try them
        self._blocks: dict[int, tuple[Arena, int]] = {}  # live address -> (arena, rounded bytes)
        # Counters in the vocabulary of tensorarena.stats: requested, allocated (rounded) and
        # reserved bytes, each current / peak / total, and the counts.
        self._requested = self._peak_requested = self._total_requested = 0
        self._allocated = self._peak_allocated = self._total_allocated = 0
        self._reserved = self._peak_reserved = self._total_reserved = 0
        self._peak_blocks = self._total_blocks = self._peak_arenas = 0
        self._upstream_allocs = self._upstream_frees = 0
        self._retries = self._ooms = 0
        # A pool that is garbage-collected gives its arenas back, as RMM's pool destructor does.
        # The finalizer holds the upstream and the arena list, never the pool itself.
        finalizer = weakref.finalize(self, release_arenas, upstream, self._arenas)
        finalizer.atexit = False  # at interpreter exit the process's memory goes anyway
        if initial:
            self._add_arena(initial, DEFAULT_ALIGNMENT, None, requested=initial)
        register_pool(self)  # a whole-program recording sees every pool (pool_observers)

    # --- properties ------------------------------------------------------------------------

    @property
    def upstream(self) -> MemoryResource:
        """The resource the arenas come from."""
        return self._upstream

    @property
    def memory_kind(self) -> MemoryKind:
        """The upstream's kind: a pool's addresses are its upstream's (an upstream that
        declares none raises AttributeError here, as it would itself)."""
        return self._upstream.memory_kind

    @property
    def growth(self) -> GrowthPolicy:
        """The growth policy sizing new arenas."""
        return self._growth

    @property
    def maximum_size(self) -> int | None:
        """The cap on bytes held from the upstream, or ``None``."""
        return self._maximum

    @property
    def thread_safe(self) -> bool:
        """Whether every call takes the pool's lock."""
        return self._thread_safe

    @property
    def closed(self) -> bool:
        """True after :meth:`close`: no new requests; live blocks may still be freed."""
        return self._closed

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Return the address of ``nbytes`` bytes aligned to ``alignment``, growing if needed.

        Raises :class:`OutOfMemoryError` when the growth policy, ``maximum_size`` or the
        upstream refuse a new arena, and :class:`ResourceClosedError` after :meth:`close`; the
        pool is unchanged when it raises.
        """
        # One body for the locked and the unlocked pool, none bound on the instance. Measured
        # against the instance-bound design (a pair, pure Python): unlocked +52 ns (the lock
        # and observer tests), locked -70 ns (one Python call fewer per method).
        lock = self._call_lock
        if lock is not None:
            lock.acquire()
        try:
            if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
                nbytes = check_nbytes(nbytes)
            if type(alignment) is not int or alignment not in ALIGNMENTS:
                alignment = check_alignment(alignment)
            if self._closed:
                raise ResourceClosedError(
                    f"this pool was closed: it takes no new requests ({self!r})"
                )
            for arena in self._arenas:
                address = (
                    arena.try_allocate(nbytes, alignment) if arena.honours(alignment) else None
                )
                if address is not None:
                    break
            else:
                arena = self._grow_for(nbytes, alignment, stream)
                address = arena.try_allocate(nbytes, alignment)
                if address is None:  # pragma: no cover - _grow checked that a fresh arena fits
                    raise InvalidAlignmentError(f"a new arena cannot hold {nbytes} bytes")
            rounded = (nbytes + alignment - 1) & -alignment
            blocks = self._blocks
            blocks[address] = (arena, rounded)
            requested = self._requested + nbytes
            self._requested = requested
            if requested > self._peak_requested:
                self._peak_requested = requested
            self._total_requested += nbytes
            allocated = self._allocated + rounded
            self._allocated = allocated
            if allocated > self._peak_allocated:
                self._peak_allocated = allocated
            self._total_allocated += rounded
            self._total_blocks += 1
            if len(blocks) > self._peak_blocks:
                self._peak_blocks = len(blocks)
            if self._debug != OFF:
                self._check_invariants(self._debug)
            if self._observer is not None:
                self._observer.allocated(address, nbytes)
            return address
        finally:
            if lock is not None:
                lock.release()

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Free the block at ``address``, which must have been allocated with ``nbytes``.

        Raises :class:`DoubleFreeError`, :class:`InvalidAddressError` (not from this pool, or
        not an int) or :class:`SizeMismatchError`, leaving the pool unchanged.
        """
        lock = self._call_lock
        if lock is not None:
            lock.acquire()
        try:
            entry = self._blocks.get(address) if type(address) is int else None
            if entry is None:
                address = check_address(address)
                entry = self._blocks.get(address)
                if entry is None:
                    raise self._not_live(address)
            if type(nbytes) is not int:
                nbytes = check_nbytes(nbytes)
            arena, rounded = entry
            arena.deallocate(address, nbytes)  # raises SizeMismatchError before any change
            del self._blocks[address]
            self._requested -= nbytes
            self._allocated -= rounded
            if self._closed and not len(arena):
                self._release_deferred(arena, stream)
            if self._debug != OFF:
                self._check_invariants(self._debug)
            if self._observer is not None:
                self._observer.freed(address, nbytes)
        finally:
            if lock is not None:
                lock.release()

    def _grow_for(self, nbytes: int, alignment: int, stream: Stream) -> Arena:
        """:meth:`_grow`, telling the observer of an out-of-memory error."""
        try:
            return self._grow(nbytes, alignment, stream)
        except MemoryError:
            if self._observer is not None:
                self._observer.out_of_memory(nbytes)
            raise

    # --- whole-pool operations ---------------------------------------------------------------

    def reset(self, *, force: bool = False) -> None:
        """Free every live block at once; the arenas stay reserved.

        Refuses with :class:`ResourceInUseError` (nothing changed) while blocks are live, since
        their bytes would be handed out again under them. ``force=True`` frees them anyway —
        **unsafe**: any array or pointer still using one of those blocks then shares its bytes
        with the next allocation. Later frees of the old addresses raise
        :class:`DoubleFreeError` unless the address was handed out again.
        """
        with self._lock:
            if self._blocks and not force:
                raise self._in_use("reset()")
            for arena in self._arenas:
                arena.reset()
            self._blocks.clear()
            self._requested = 0
            self._allocated = 0

    def trim(self, stream: Stream = None) -> int:
        """Give every empty arena back to the upstream; return the bytes released."""
        with self._lock:
            return self._trim(stream)

    def close(self) -> None:
        """Give every arena back to the upstream: empty ones now, each other one as soon as its
        last live block is freed; from now on the pool refuses new requests.

        Closing never unmaps bytes that a live block (an array, a tensor) still uses. Closing
        twice is harmless. Leaving ``with Pool(...) as pool:`` closes the pool.
        """
        with self._lock:
            self._closed = True
            self._trim(None)

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- queries -----------------------------------------------------------------------------

    def owns(self, address: int) -> bool:
        """True if ``address`` is a live block of this pool."""
        return type(address) is int and address in self._blocks

    def size_of(self, address: int) -> int:
        """The requested size of the live block at ``address``."""
        with self._lock:
            address = check_address(address)
            entry = self._blocks.get(address)
            if entry is None:
                raise self._not_live(address)
            return entry[0].size_of(address)

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            blocks: dict[int, int] = {}
            for arena in self._arenas:
                blocks.update(arena.live_blocks())
            return blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def __repr__(self) -> str:
        limit = "" if self._maximum is None else f", maximum={format_size(self._maximum)}"
        closed = ", closed" if self._closed else ""
        return (
            f"Pool(upstream={type(self._upstream).__name__}, strategy={self._strategy_name}, "
            f"growth={self._growth!r}, arenas={len(self._arenas)}, "
            f"reserved={format_size(self._reserved)}, "
            f"requested={format_size(self._requested)}, live={len(self._blocks)}{limit}{closed})"
        )

    # --- errors ------------------------------------------------------------------------------

    def _in_use(self, operation: str) -> ResourceInUseError:
        live, nbytes = len(self._blocks), self._requested
        return ResourceInUseError(
            f"{operation} refused: {live} block(s) ({format_size(nbytes)}) are still live in "
            "this pool and would be handed out again under their users. Free them first (an "
            "adaptor in front, such as ThreadCached, holds blocks too: flush_all() it), or "
            "pass force=True if nothing uses them (unsafe)",
            live_blocks=live,
            live_bytes=nbytes,
        )

    def _not_live(self, address: int) -> InvalidAddressError:
        for arena in self._arenas:
            if arena.owns(address):
                try:
                    arena.size_of(address)  # not live: raises the arena's precise error
                except InvalidAddressError as exc:
                    return exc
        return InvalidAddressError(
            f"address {address:#x} was not allocated by this pool (no arena holds it; "
            "an arena given back by trim() no longer counts)",
            address=address,
        )

