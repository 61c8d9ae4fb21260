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

Stream-ordered allocations (``stream`` not ``None``) bypass the caches: a block freed on one
stream may not be reused on another before that stream's work is done.

Cached blocks are live blocks of the upstream: call ``flush_all()`` before resetting or closing
the upstream pool, or the flush will find them already freed.
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
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.sizes import Size, format_size, parse_size

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
    upstream_allocations: int
    upstream_deallocations: int  #: large frees, stream-ordered frees, and flushed blocks
    allocation_count: int  #: blocks handed out and not yet freed

    @property
    def hit_rate(self) -> float:
        """Fraction of cacheable allocations served from a cache (0 when there were none)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Cache:
    """One thread's cache. Its lock is uncontended except while ``flush_all`` drains it."""

    __slots__ = ("buckets", "count", "hits", "lock", "misses", "nbytes")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[_Key, list[int]] = {}  # each list: oldest first, newest last
        self.nbytes = 0
        self.count = 0
        self.hits = 0
        self.misses = 0


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
        self.retired_hits = 0  # hits and misses of threads that ended, so totals survive them
        self.retired_misses = 0

    def drain(self, cache: _Cache, max_bytes: int, max_blocks: int) -> None:
        """Give the cache's oldest blocks back upstream until it is within the bounds."""
        victims: list[tuple[int, _Key]] = []
        with cache.lock:
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
        if not victims:
            return
        with self.upstream_lock:
            for i, (address, key) in enumerate(victims):
                try:
                    self.upstream.deallocate(address, key[0], None)
                except BaseException:
                    self._restore(cache, victims[i:])
                    raise
                self.upstream_deallocations += 1

    @staticmethod
    def _restore(cache: _Cache, blocks: list[tuple[int, _Key]]) -> None:
        # The upstream refused a block it handed out: keep the rest cached rather than lose them.
        with cache.lock:
            for address, key in blocks:
                cache.buckets.setdefault(key, []).insert(0, address)
                cache.nbytes += key[0]
                cache.count += 1

    def retire(self, cache: _Cache) -> None:
        """The thread owning ``cache`` ended: flush it and forget it."""
        try:
            self.drain(cache, 0, 0)
        finally:
            with self.caches_lock:
                self.caches.discard(cache)
                self.retired_hits += cache.hits
                self.retired_misses += cache.misses


class ThreadCached:
    """Per-thread caches of small freed blocks in front of ``upstream`` (see the module doc)."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        max_block_size: Size = "1MiB",
        max_cached_bytes: Size = "8MiB",
        max_cached_blocks: int = 1024,
    ) -> None:
        if not callable(getattr(upstream, "allocate", None)):
            raise TypeError(f"upstream must be a memory resource, not {type(upstream).__name__}")
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
    def upstream(self) -> MemoryResource:
        """The shared resource behind the caches."""
        return self._upstream

    @property
    def max_block_size(self) -> int:
        """Blocks larger than this bypass the caches."""
        return self._max_block

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A cached block of exactly ``(nbytes, alignment)`` if this thread has one, else the
        upstream's."""
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
            key = (nbytes, alignment)
            with cache.lock:
                stack = cache.buckets.get(key)
                if stack:
                    # An emptied bucket stays (no list churn); drain() removes empty ones.
                    address = stack.pop()
                    cache.nbytes -= nbytes
                    cache.count -= 1
                    cache.hits += 1
                    self._live[address] = key
                    return address
        shared = self._shared
        with shared.upstream_lock:
            address = self._upstream.allocate(nbytes, alignment, stream)
            shared.upstream_allocations += 1
        if cache is not None:
            cache.misses += 1  # counted after success: only the owning thread writes it
        self._live[address] = (nbytes, alignment)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Keep the block in this thread's cache if it is small, else give it back upstream."""
        key = self._live.pop(address, None) if type(address) is int else None
        if key is None:
            raise self._not_live(address)
        if key[0] != nbytes:
            self._live[address] = key
            raise SizeMismatchError(
                f"block at {address:#x} was allocated with {key[0]} bytes, "
                f"deallocated with {nbytes!r}",
                address=address,
                given=nbytes,
                allocated=key[0],
            )
        if stream is None and nbytes <= self._max_block:
            try:
                cache = self._local.cache
            except AttributeError:
                cache = self._new_cache()
            with cache.lock:
                stack = cache.buckets.get(key)
                if stack is None:
                    cache.buckets[key] = [address]
                else:
                    stack.append(address)
                cache.nbytes += nbytes
                cache.count += 1
                over = cache.nbytes > self._max_bytes or cache.count > self._max_blocks
            if over:
                self._shared.drain(cache, self._max_bytes // 2, self._max_blocks // 2)
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
            self._shared.drain(cache, 0, 0)

    def flush_all(self) -> None:
        """Give every cached block of every thread back to the upstream."""
        with self._shared.caches_lock:
            caches = list(self._shared.caches)
        for cache in caches:
            self._shared.drain(cache, 0, 0)

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
        nbytes = count = 0
        for cache in caches:
            with cache.lock:
                nbytes += cache.nbytes
                count += cache.count
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
            upstream_allocations=up_allocs,
            upstream_deallocations=up_deallocs,
            allocation_count=len(self._live),
        )

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"ThreadCached({self._upstream!r}, threads={stats.threads}, "
            f"cached={format_size(stats.cached_bytes)} in {stats.cached_blocks} blocks, "
            f"live={stats.allocation_count})"
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

    def _not_live(self, address: object) -> InvalidAddressError:
        if type(address) is not int:
            return InvalidAddressError(
                f"address must be an int, not {type(address).__name__}", address=-1
            )
        with self._shared.caches_lock:
            caches = list(self._shared.caches)
        for cache in caches:
            with cache.lock:
                if any(address in stack for stack in cache.buckets.values()):
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
