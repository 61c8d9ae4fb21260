"""The body of :class:`~tensorarena.adaptors.ThreadCached`: the caches and the hot paths.

How it works, and why it is safe, is told in :mod:`tensorarena.adaptors.thread_cached`, where the
public class is. This module holds everything else; the compiled build compiles it with mypyc
(``_version.COMPILED_MODULES``), so a cache hit or put runs as C with native attribute access.
``ThreadCached`` itself is an ordinary Python subclass of :class:`ThreadCachedCore` (and of
``ResourceAdaptor``): instances stay weakly referenceable, which mypyc's native classes are not.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidSizeError,
    SizeMismatchError,
)
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
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

try:  # mypyc's class options; it ships with mypy, which the pure build need not have
    from mypy_extensions import mypyc_attr
except ImportError:

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Any:  # type: ignore[misc]
        """Interpreted, the options mean nothing: leave the class as it is."""
        return lambda cls: cls


__all__ = ["ThreadCacheStatistics", "ThreadCachedCore"]

# (nbytes, alignment). Written as a variable-length tuple type on purpose: mypyc keeps such a
# tuple as the Python object it is, where a fixed-length one becomes a C struct that is boxed into
# a new tuple at every use as a dict key (twice per hit, twice per put).
_Key = tuple[int, ...]


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


# Lives in the thread-local state; its death (the thread ended) flushes the cache. Made with
# type() so that it stays an ordinary Python class in the compiled build: the finalizer needs a
# weak reference to it, which a mypyc native class does not support.
_Token: Any = type("_Token", (), {"__slots__": ("__weakref__",), "__module__": __name__})


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


@mypyc_attr(allow_interpreted_subclasses=True)
class ThreadCachedCore:
    """Everything :class:`~tensorarena.adaptors.ThreadCached` does (see the module doc)."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        max_block_size: Size | Any = "1MiB",
        max_cached_bytes: Size | Any = "8MiB",
        max_cached_blocks: int | Any = 1024,
    ) -> None:
        # ``| Any``: compiled, a declared type is checked at the call with a bare TypeError;
        # the checks below give each bad bound its own InvalidSizeError in either build.
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
        self, nbytes: int | Any, alignment: int | Any = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A cached block of exactly ``(nbytes, alignment)`` if this thread has one, else the
        upstream's (after flushing every cache and retrying once if the upstream is out of
        memory)."""
        # (``int | Any``: the compiled build checks declared argument types at the call, and
        # integer-likes must reach the normalisation below.)
        if type(nbytes) is not int or type(alignment) is not int:
            # Normalised before anything keys a cache: np.int64 or "1KiB" sizes cached as such
            # could never be flushed. Exact types: True == 1 and 1.0 == 1 hash alike, and must
            # not hit a (n, 1) bucket.
            return self.allocate(check_nbytes(nbytes), check_alignment(alignment), stream)
        cache: _Cache | None = None
        if stream is None and 0 < nbytes <= self._max_block:
            mine: _Cache
            try:
                mine = self._local.cache
            except AttributeError:
                mine = self._new_cache()
            cache = mine
            # No lock: only this thread writes the counters and pushes onto its lists; a
            # flush_all on another thread may pop(0) concurrently, each block goes to one side.
            key = (nbytes, alignment)
            stack = mine.buckets.get(key)
            if stack:
                try:
                    address = stack.pop()
                except IndexError:  # a foreign flush emptied it since the check: a miss
                    pass
                else:
                    # An emptied bucket stays (no list churn); the owner's drains remove it.
                    mine.nbytes -= nbytes
                    mine.count -= 1
                    mine.hits += 1
                    self._live[address] = key
                    return address
            if mine.orphans:  # blocks a foreign flush could not give back: take them in
                with mine.lock:
                    mine.adopt_locked()
                return self.allocate(nbytes, alignment, stream)  # one of them may fit
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

    def deallocate(self, address: int | Any, nbytes: int | Any, stream: Stream = None) -> None:
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
            cache: _Cache
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
