"""``ThreadCached``: per-thread caches of freed small blocks in front of a shared upstream.

The idea of tcmalloc's thread caches and mimalloc's thread-local heaps, at the resource level: a
thread that frees a small block keeps it in its own cache, keyed by ``(nbytes, alignment)``, and
its next request of the same shape takes it back without touching the upstream or its lock.
Only misses, large blocks (over ``max_block_size``) and flushes reach the upstream, and those
calls are serialised by the adaptor's own lock, so the upstream need not be thread-safe itself
(wrapping it in :class:`~tensorarena.adaptors.ThreadSafe` as well is harmless).

Bounds and flushing. A thread's cache is trimmed back to half its bounds, oldest blocks first,
when it holds more than ``max_cached_bytes`` or ``max_cached_blocks``; ``flush()`` empties the
calling thread's cache, ``flush_all()`` every thread's, and a thread's cache is flushed
automatically when the thread ends (a ``weakref.finalize`` on a token kept in the thread-local
state; the finalizer holds the upstream, not the adaptor, so it works even after the adaptor is
gone).

Cross-thread frees. A block allocated by thread A and freed by thread B goes into *B's* cache.
That is safe because a cached block belongs to no thread in particular: it is a live block of the
shared upstream, and whichever thread holds it either hands it out again (to one caller) or
gives it back upstream (once).

Nothing lost, nothing handed out twice: the adaptor keeps one map of the blocks it has handed
out (address → (nbytes, alignment)); a free removes the entry *before* the block is cached, so a
second free of the same address fails (``DoubleFreeError`` while it sits in a cache,
``InvalidAddressError`` once it went back upstream) instead of caching the block twice. Single
dict operations are atomic in CPython, so the map needs no lock on the hot path.

No lock on the owner's hot path. A cache hit (``stack.pop()``) and a cache put
(``stack.append()``) take no lock: ``list.pop``/``list.append`` are atomic under the GIL (and
per-object locked on free-threaded builds), so the owner and a drainer on another thread never
take the same block. The counters are single-writer: the owner alone writes ``nbytes``,
``count``, ``hits`` and ``misses``; a drainer on another thread (``flush_all``) adds what it took
to ``drained_bytes``/``drained_count`` instead, under the cache's drain lock, which only drainers
and the owner's own (rare) drains take. The cache holds ``nbytes - drained_bytes`` bytes (and
likewise blocks): that is what bounds and statistics use. A foreign drainer only takes blocks
with ``pop(0)``: it never deletes a bucket or replaces a list, because the owner may hold a
reference to it and append a block that would then be lost. The owner's drains (over bounds,
``flush()``) run on the owner thread, so they may delete emptied buckets and fold the drained
counters back into the owner's. A cache records its owner's thread ident to tell the cases
apart; a thread-end ``retire`` runs when the owner is dead and treats the cache as its own.

Refused flushes. If the upstream refuses a flushed block (it never handed it out: corruption),
the rest of the batch is put back rather than lost and the error propagates. The owner puts
them back into their buckets; a foreign drainer puts a block back into its bucket's list if that
still exists, else into the cache's ``orphans`` list (it must not create buckets), which counts as
cached, is drained like a bucket, and which the owner adopts into its buckets on its next miss
or drain.

Stream-ordered allocations (``stream`` not ``None``) bypass the caches: a block freed on one
stream may not be reused on another before that stream's work is done.

Cached blocks are live blocks of the upstream, so a :class:`~tensorarena.memory.Pool` below
refuses ``reset()`` while any sit in a cache (``flush_all()`` first), and its ``close()`` keeps
their arenas until they come back. When the upstream runs out of memory, every thread's cache
is flushed and the request retried once (as PyTorch's allocator frees its cached blocks and
retries), counted in ``num_alloc_retries``.

One input rule: sizes, alignments and addresses are normalised to exact ints at this edge
(``np.int64``, ``"1KiB"``) before they key a cache, so every cached block can be flushed.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from types import TracebackType

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidSizeError,
    SizeMismatchError,
)
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import (
    Size,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)

__all__ = ["ThreadCacheStatistics", "ThreadCached"]

_Key = tuple[int, int]  # (nbytes, alignment)


@dataclass(frozen=True, slots=True)
class ThreadCacheStatistics:
    """A snapshot of a :class:`ThreadCached` adaptor, summed over every thread's cache."""

    cached_bytes: int  #: bytes sitting in thread caches now (free for reuse, held upstream)
    cached_blocks: int
    threads: int  #: threads with a cache (live threads that have used the adaptor)
    hits: int  #: allocations served from a thread cache (ended threads included)
    misses: int  #: small allocations that had to go upstream (ended threads included)
    num_upstream_allocs: int
    num_upstream_frees: int  #: large frees, stream-ordered frees, and flushed blocks
    live_blocks: int  #: blocks handed out and not yet freed
    num_alloc_retries: int = 0  #: requests served after flushing every cache and retrying

    @property
    def hit_rate(self) -> float:
        """Fraction of cacheable allocations served from a cache (0 when there were none)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Cache:
    """One thread's cache. The owner thread alone writes ``nbytes``, ``count``, ``hits`` and
    ``misses`` and touches the lists without a lock; ``lock`` serialises drains only."""

    __slots__ = (
        "buckets",
        "count",
        "drained_bytes",
        "drained_count",
        "hits",
        "lock",
        "misses",
        "nbytes",
        "orphans",
        "owner",
    )

    def __init__(self) -> None:
        self.lock = threading.Lock()  # drain lock: taken by drains, never by the hot paths
        self.owner = threading.get_ident()
        self.buckets: dict[_Key, list[int]] = {}  # each list: oldest first, newest last
        self.nbytes = 0  # owner-written: bytes put minus bytes taken by the owner
        self.count = 0
        self.drained_bytes = 0  # drainer-written (under lock): bytes foreign drains took
        self.drained_count = 0
        self.orphans: list[tuple[int, _Key]] = []  # refused blocks with no bucket to go back to
        self.hits = 0
        self.misses = 0

    def cached(self) -> tuple[int, int]:
        """``(bytes, blocks)`` held now; exact when no thread is using the cache."""
        return self.nbytes - self.drained_bytes, self.count - self.drained_count

    def adopt_locked(self) -> None:
        """Owner only, lock held: move orphans into buckets (oldest first) and fold the
        drained counters into the owner's, so that they stop growing without bound."""
        orphans = self.orphans
        while orphans:
            address, key = orphans.pop()
            self.buckets.setdefault(key, []).insert(0, address)
            # An orphan was counted as drained and uncounted again: the owner now counts it.
        self.nbytes -= self.drained_bytes
        self.count -= self.drained_count
        self.drained_bytes = 0
        self.drained_count = 0


class _Token:
    """Lives in the thread-local state; its death (the thread ended) flushes the cache."""

    __slots__ = ("__weakref__",)


class _Shared:
    """What the thread-end finalizers need, without a reference to the adaptor itself."""

    def __init__(self, upstream: MemoryResource) -> None:
        self.upstream = upstream
        self.upstream_lock = threading.Lock()
        self.caches: set[_Cache] = set()
        self.caches_lock = threading.Lock()
        self.upstream_allocations = 0
        self.upstream_deallocations = 0
        self.retries = 0
        self.retired_hits = 0  # hits and misses of threads that ended, so totals survive them
        self.retired_misses = 0

    def drain(self, cache: _Cache, max_bytes: int, max_blocks: int, *, owned: bool) -> None:
        """Give the cache's oldest blocks back upstream until it is within the bounds.

        ``owned``: the caller is the cache's owner thread, or the owner is dead; otherwise the
        owner may be using the lists concurrently, so only ``pop(0)`` them and drain them all.
        """
        victims: list[tuple[int, _Key]] = []
        with cache.lock:
            if owned:
                cache.adopt_locked()
                for key in list(cache.buckets):
                    if cache.nbytes <= max_bytes and cache.count <= max_blocks:
                        break
                    stack = cache.buckets[key]
                    nbytes = key[0]
                    taken = 0
                    while taken < len(stack) and (
                        cache.nbytes > max_bytes or cache.count > max_blocks
                    ):
                        victims.append((stack[taken], key))
                        cache.nbytes -= nbytes
                        cache.count -= 1
                        taken += 1
                    del stack[:taken]
                    if not stack:
                        del cache.buckets[key]
                if max_bytes == max_blocks == 0:  # a full flush drops buckets others emptied
                    for key in [key for key, stack in cache.buckets.items() if not stack]:
                        del cache.buckets[key]
            else:
                # dict.copy() is atomic; the owner may add buckets meanwhile (blocks freed
                # after this flush began, left for the next one).
                for key, stack in cache.buckets.copy().items():
                    while True:
                        try:
                            address = stack.pop(0)
                        except IndexError:
                            break
                        victims.append((address, key))
                        cache.drained_bytes += key[0]
                        cache.drained_count += 1
                orphans = cache.orphans
                while orphans:
                    address, key = orphans.pop(0)
                    victims.append((address, key))
                    cache.drained_bytes += key[0]
                    cache.drained_count += 1
        if not victims:
            return
        with self.upstream_lock:
            for i, (address, key) in enumerate(victims):
                try:
                    self.upstream.deallocate(address, key[0], None)
                except BaseException:
                    self._restore(cache, victims[i:], owned=owned)
                    raise
                self.upstream_deallocations += 1

    @staticmethod
    def _restore(cache: _Cache, blocks: list[tuple[int, _Key]], *, owned: bool) -> None:
        # The upstream refused a block it handed out: keep the rest cached rather than lose them.
        with cache.lock:
            for address, key in reversed(blocks):  # insert(0) in reverse keeps oldest first
                if owned:
                    cache.buckets.setdefault(key, []).insert(0, address)
                    cache.nbytes += key[0]
                    cache.count += 1
                    continue
                # Not the owner: never create a bucket (the owner would not see it), and undo
                # the drained count rather than touch the owner's counters.
                stack = cache.buckets.get(key)
                if stack is None:
                    cache.orphans.insert(0, (address, key))
                else:
                    stack.insert(0, address)
                cache.drained_bytes -= key[0]
                cache.drained_count -= 1

    def retire(self, cache: _Cache) -> None:
        """The thread owning ``cache`` ended: flush it and forget it."""
        try:
            self.drain(cache, 0, 0, owned=True)  # the owner is dead: nobody races the lists
        finally:
            with self.caches_lock:
                self.caches.discard(cache)
                self.retired_hits += cache.hits
                self.retired_misses += cache.misses


class ThreadCached(ResourceAdaptor):
    """Per-thread caches of small freed blocks in front of ``upstream`` (see the module doc)."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        max_block_size: Size = "1MiB",
        max_cached_bytes: Size = "8MiB",
        max_cached_blocks: int = 1024,
    ) -> None:
        upstream = check_resource(upstream)
        self._max_block = parse_size(max_block_size, name="max_block_size", allow_zero=True)
        self._max_bytes = parse_size(max_cached_bytes, name="max_cached_bytes", allow_zero=True)
        if type(max_cached_blocks) is not int or max_cached_blocks < 0:
            raise InvalidSizeError(
                f"max_cached_blocks must be a non-negative int, got {max_cached_blocks!r}"
            )
        self._max_blocks = max_cached_blocks
        self._upstream = upstream
        self._shared = _Shared(upstream)
        self._local = threading.local()
        self._live: dict[int, _Key] = {}  # every block handed out and not yet freed

    # --- properties ------------------------------------------------------------------------

    @property
    def max_block_size(self) -> int:
        """Blocks larger than this bypass the caches."""
        return self._max_block

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A cached block of exactly ``(nbytes, alignment)`` if this thread has one, else the
        upstream's (after flushing every cache and retrying once if the upstream is out of
        memory)."""
        cache = None
        # Exact types: True == 1 and 1.0 == 1 hash alike, and must not hit a (n, 1) bucket.
        if (
            stream is None
            and type(nbytes) is int
            and 0 < nbytes <= self._max_block
            and type(alignment) is int
        ):
            try:
                cache = self._local.cache
            except AttributeError:
                cache = self._new_cache()
            # No lock: only this thread writes the counters and pushes onto its lists; a
            # flush_all on another thread may pop(0) concurrently, each block goes to one side.
            stack = cache.buckets.get((nbytes, alignment))
            if stack:
                try:
                    address = stack.pop()
                except IndexError:  # a foreign flush emptied it since the check: a miss
                    pass
                else:
                    # An emptied bucket stays (no list churn); the owner's drains remove it.
                    cache.nbytes -= nbytes
                    cache.count -= 1
                    cache.hits += 1
                    self._live[address] = (nbytes, alignment)
                    return address
            if cache.orphans:  # blocks a foreign flush could not give back: take them in
                with cache.lock:
                    cache.adopt_locked()
                return self.allocate(nbytes, alignment, stream)  # one of them may fit
        elif type(nbytes) is not int or type(alignment) is not int:
            # Normalised before anything keys a cache: np.int64 or "1KiB" sizes cached as such
            # could never be flushed.
            return self.allocate(check_nbytes(nbytes), check_alignment(alignment), stream)
        shared = self._shared
        try:
            with shared.upstream_lock:
                address = self._upstream.allocate(nbytes, alignment, stream)
                shared.upstream_allocations += 1
        except MemoryError:
            if not self._caches_hold_blocks():
                raise
            address = self._flush_and_retry(nbytes, alignment, stream)
        if cache is not None:
            cache.misses += 1  # counted after success: only the owning thread writes it
        self._live[address] = (nbytes, alignment)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Keep the block in this thread's cache if it is small, else give it back upstream."""
        key = self._live.pop(address, None) if type(address) is int else None
        if key is None:
            if type(address) is not int:  # an integer-like: normalise it, or refuse a float
                return self.deallocate(check_address(address), nbytes, stream)
            raise self._not_live(address)
        if type(nbytes) is not int or key[0] != nbytes:
            self._live[address] = key  # put back before anything can raise
            given = check_nbytes(nbytes)
            if given != key[0]:
                raise SizeMismatchError(
                    f"block at {address:#x} was allocated with {key[0]} bytes, "
                    f"deallocated with {nbytes!r}",
                    address=address,
                    given=given,
                    allocated=key[0],
                )
            del self._live[address]
            nbytes = given
        if stream is None and nbytes <= self._max_block:
            try:
                cache = self._local.cache
            except AttributeError:
                cache = self._new_cache()
            # No lock (see allocate): appending to a list a foreign drain is popping is safe.
            stack = cache.buckets.get(key)
            if stack is None:
                cache.buckets[key] = [address]
            else:
                stack.append(address)
            cache.nbytes += nbytes
            cache.count += 1
            # The drained counters are not negative, so the owner's own counts bound what is
            # cached from above: only when they are over is the exact check needed. (A refused
            # foreign flush racing an owner drain can leave them negative: the cache may then
            # exceed its bounds by those refused blocks until the owner's next drain.)
            if (cache.nbytes > self._max_bytes or cache.count > self._max_blocks) and (
                cache.nbytes - cache.drained_bytes > self._max_bytes
                or cache.count - cache.drained_count > self._max_blocks
            ):
                self._shared.drain(cache, self._max_bytes // 2, self._max_blocks // 2, owned=True)
            return
        shared = self._shared
        try:
            with shared.upstream_lock:
                self._upstream.deallocate(address, nbytes, stream)
                shared.upstream_deallocations += 1
        except BaseException:
            self._live[address] = key
            raise

    # --- flushing ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Give every block in the calling thread's cache back to the upstream."""
        cache = getattr(self._local, "cache", None)
        if cache is not None:
            self._shared.drain(cache, 0, 0, owned=True)

    def flush_all(self) -> None:
        """Give every cached block of every thread back to the upstream."""
        with self._shared.caches_lock:
            caches = list(self._shared.caches)
        me = threading.get_ident()
        for cache in caches:
            # An ident equal to ours means we own it, or its owner is dead (idents are unique
            # among live threads): either way nobody uses its lists without the lock.
            self._shared.drain(cache, 0, 0, owned=cache.owner == me)

    def _caches_hold_blocks(self) -> bool:
        with self._shared.caches_lock:
            return any(cache.cached()[1] for cache in self._shared.caches)

    def _flush_and_retry(self, nbytes: int, alignment: int, stream: Stream) -> int:
        """The upstream is out of memory: give every cached block back and try once more."""
        shared = self._shared
        self.flush_all()
        with shared.upstream_lock:
            address = self._upstream.allocate(nbytes, alignment, stream)
            shared.upstream_allocations += 1
            shared.retries += 1
        return address

    def close(self) -> None:
        """Flush every cache (the adaptor stays usable)."""
        self.flush_all()

    def __enter__(self) -> ThreadCached:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- queries -----------------------------------------------------------------------------

    def statistics(self) -> ThreadCacheStatistics:
        """A snapshot summed over every thread's cache."""
        shared = self._shared
        with shared.caches_lock:
            caches = list(shared.caches)
            hits, misses = shared.retired_hits, shared.retired_misses
            retries = shared.retries
        nbytes = count = 0
        for cache in caches:
            with cache.lock:  # excludes drains (and the owner's folding); not the hot path
                cached_bytes, cached_blocks = cache.cached()
                nbytes += cached_bytes
                count += cached_blocks
                hits += cache.hits
                misses += cache.misses
        with shared.upstream_lock:
            up_allocs, up_deallocs = shared.upstream_allocations, shared.upstream_deallocations
        return ThreadCacheStatistics(
            cached_bytes=nbytes,
            cached_blocks=count,
            threads=len(caches),
            hits=hits,
            misses=misses,
            num_upstream_allocs=up_allocs,
            num_upstream_frees=up_deallocs,
            live_blocks=len(self._live),
            num_alloc_retries=retries,
        )

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"ThreadCached({self._upstream!r}, threads={stats.threads}, "
            f"cached={format_size(stats.cached_bytes)} in {stats.cached_blocks} blocks, "
            f"live={stats.live_blocks})"
        )

    # --- internals ---------------------------------------------------------------------------

    def _new_cache(self) -> _Cache:
        """Make, register and return the calling thread's cache (its first call here)."""
        cache = _Cache()
        token = _Token()
        shared = self._shared
        with shared.caches_lock:
            shared.caches.add(cache)
        # When the thread ends its thread-local state dies, the token with it, and the
        # finalizer gives the cached blocks back. It references only `shared` and `cache`.
        finalizer = weakref.finalize(token, shared.retire, cache)
        finalizer.atexit = False  # at interpreter exit the upstream is going away too
        self._local.cache = cache
        self._local.token = token
        return cache

    def _not_live(self, address: int) -> InvalidAddressError:
        with self._shared.caches_lock:
            caches = list(self._shared.caches)
        for cache in caches:
            with cache.lock:
                stacks = list(cache.buckets.copy().values())
                stacks.append([orphan for orphan, _ in cache.orphans])
                if any(address in stack for stack in stacks):
                    return DoubleFreeError(
                        f"double free: block at {address:#x} was already freed (it sits in a "
                        "thread cache)",
                        address=address,
                    )
        return InvalidAddressError(
            f"address {address:#x} is not live in this ThreadCached adaptor: never allocated "
            "through it, or already freed and returned upstream",
            address=address,
        )
