"""The body of :class:`~tensorarena.adaptors.ThreadCached`: the caches and the hot paths.

How it works, and why it is safe, is told in :mod:`tensorarena.adaptors.thread_cached`, where the
public class is. This module holds everything else; the compiled build compiles it with mypyc
(``_version.COMPILED_MODULES``), so a cache hit or put runs as C with native attribute access.
``ThreadCached`` itself is an ordinary Python subclass of :class:`ThreadCachedCore` (and of
``ResourceAdaptor``): instances stay weakly referenceable, which mypyc's native classes are not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from tensorarena.adaptors._thread_cache_state import (
    ALIGNMENT_BITS,
    ALIGNMENT_MASK,
    NO_OWNER,
    Cache,
    Key,
    Shared,
    bucket_key,
    new_cache,
)
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

#: Finds this thread's cache fast (see ``ThreadCachedCore._last``); a C static when compiled.
_get_ident: Final = threading.get_ident


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
        self._shared = Shared(upstream)
        self._local = threading.local()
        # The cache used last, by any thread. The thread whose ident is its owner takes it
        # without the slower thread-local read: it is that thread's own, since idents are unique
        # among live threads and a cache whose thread ended was retired (owner NO_OWNER) as that
        # thread's state was cleared, before its ident could be reused. One attribute, read
        # once: a thread gets one cache and checks that cache's owner; any may overwrite it.
        self._last = Cache(NO_OWNER)  # a placeholder that no thread takes
        # Every block handed out and not yet freed, address -> bucket key. Keys and values kept
        # as the objects they are (``Any``): compiled, an ``int`` would be unboxed and boxed anew.
        self._live: dict[Any, Key] = {}
        # Its pop, bound once: the atomic take of a free. Compiled, ``self._live.pop(...)`` would
        # look the method up by name at every call (mypyc has no dict.pop of its own).
        self._pop_live: Callable[[Any, None], Key | None] = self._live.pop

    # --- properties ------------------------------------------------------------------------

    @property
    def max_block_size(self) -> int:
        """Blocks larger than this bypass the caches."""
        return self._max_block

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int | Any, alignment: int | Any = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int | Any:
        """A cached block of exactly ``(nbytes, alignment)`` if this thread has one, else the
        upstream's (after flushing every cache and retrying once if the upstream is out of
        memory)."""
        # (``int | Any``: the compiled build checks declared argument types at the call, and
        # integer-likes must reach the normalisation below. Returned too: compiled, an ``int``
        # would be unboxed and boxed anew, a new object for the caller's free to look up.)
        if type(nbytes) is not int or type(alignment) is not int:
            # Normalised before anything keys a cache: np.int64 or "1KiB" sizes cached as such
            # could never be flushed. Exact types: True == 1 and 1.0 == 1 hash alike, and must
            # not hit a (n, 1) bucket.
            return self.allocate(check_nbytes(nbytes), check_alignment(alignment), stream)
        size: int = nbytes
        align: int = alignment
        cache: Cache | None = None
        if stream is None and 0 < size <= self._max_block:
            mine = self._last
            if mine.owner != _get_ident():
                mine = self._my_cache()
            cache = mine
            # No lock: only this thread writes the counters and pushes onto its lists; a
            # flush_all on another thread may pop(0) concurrently, each block goes to one side.
            # The last-used bucket if it has this shape: a repeated shape hashes nothing and
            # makes no key. (Written out, here and in deallocate: the pure build pays for calls.)
            if size == mine.last_nbytes and align == mine.last_alignment:
                stack: list[Any] | None = mine.last_stack
                key = mine.last_key
            else:
                if 0 <= align <= ALIGNMENT_MASK:  # bucket_key(size, align)
                    key = size << ALIGNMENT_BITS | align
                else:
                    key = (size, align)
                stack = mine.buckets.get(key)
                if stack is not None:  # now the last used
                    mine.last_nbytes = size
                    mine.last_alignment = align
                    mine.last_key = key
                    mine.last_stack = stack
            if stack:
                try:
                    address = stack.pop()
                except IndexError:  # a foreign flush emptied it since the check: a miss
                    pass
                else:
                    # An emptied bucket stays (no list churn); the owner's drains remove it.
                    mine.nbytes -= size
                    mine.count -= 1
                    mine.hits += 1
                    self._live[address] = key
                    return address
            if mine.orphans:  # blocks a foreign flush could not give back: take them in
                with mine.lock:
                    mine.adopt_locked()
                return self.allocate(size, align, stream)  # one of them may fit
        shared = self._shared
        try:
            with shared.upstream_lock:
                address = self._upstream.allocate(size, align, stream)
                shared.upstream_allocations += 1
        except MemoryError:
            if not self._caches_hold_blocks():
                raise
            address = self._flush_and_retry(size, align, stream)
        if cache is not None:
            cache.misses += 1  # counted after success: only the owning thread writes it
        self._live[address] = bucket_key(size, align)
        return address

    def deallocate(self, address: int | Any, nbytes: int | Any, stream: Stream = None) -> None:
        """Keep the block in this thread's cache if it is small, else give it back upstream."""
        # Kept as the object it is: compiled, the int it is narrowed to below would be unboxed,
        # and boxed anew (a new object to hash and compare) for every dict and list operation.
        block: Any = address
        if type(address) is not int or type(nbytes) is not int:
            # Integer-likes normalised (anything else refused) before anything is looked up.
            return self.deallocate(check_address(address), check_nbytes(nbytes), stream)
        key = self._pop_live(block, None)  # atomic: of two racing frees, one gets the block
        if key is None:
            raise self._not_live(address)
        given: int = nbytes
        cache: Cache | None = None
        if stream is None:  # the block may be cached: in this thread's cache (see allocate)
            cache = self._last
            if cache.owner != _get_ident():
                cache = self._my_cache()
        if cache is not None and key is cache.last_key:
            size = cache.last_nbytes  # handed out by the last-used bucket: its shape is known
        elif type(key) is int:  # key_nbytes(key), written out
            size = key >> ALIGNMENT_BITS
        else:
            size = cast("tuple[int, ...]", key)[0]
        if given != size:
            self._live[block] = key  # put back: it was live, and still is
            raise SizeMismatchError(
                f"block at {address:#x} was allocated with {size} bytes, "
                f"deallocated with {nbytes!r}",
                address=address,
                given=given,
                allocated=size,
            )
        if cache is not None and size <= self._max_block:
            # No lock (see allocate): appending to a list a foreign drain is popping is safe.
            if key is cache.last_key:  # freed as it was handed out: the key object is the same
                cache.last_stack.append(block)
            else:
                stack = cache.buckets.get(key)
                if stack is None:
                    # Made holding the block: a list made with room for one goes from one block
                    # to none and back without reallocating ([] then append would, every time).
                    cache.buckets[key] = [block]
                else:
                    stack.append(block)
            cache.nbytes += size
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
                self._upstream.deallocate(block, size, stream)
                shared.upstream_deallocations += 1
        except BaseException:
            self._live[block] = key
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

    def _my_cache(self) -> Cache:
        """The calling thread's cache, from its thread-local state (made on its first call);
        it becomes the last used."""
        cache: Cache
        try:
            cache = self._local.cache
        except AttributeError:
            cache = new_cache(self._shared, self._local)
        self._last = cache
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
