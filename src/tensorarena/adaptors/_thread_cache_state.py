"""The state behind :class:`~tensorarena.adaptors.ThreadCached`: bucket keys, one thread's cache,
and the shared part (drains, thread-end retirement) that outlives the adaptor.

Compiled with the hot paths in :mod:`tensorarena.adaptors._thread_cache` (one mypyc group, so
their attribute reads here are native); why the lock-free scheme is safe is told in
:mod:`tensorarena.adaptors.thread_cached`.

Bucket keys. A bucket holds the cached blocks of one exact ``(nbytes, alignment)``. Its key is the
int ``nbytes << 32 | alignment`` when ``0 <= alignment < 2**32`` (every real alignment), else the
tuple. ``nbytes = key >> 32`` and ``alignment = key & (2**32 - 1)`` undo the int exactly, for any
``nbytes``, so two pairs never share an int key, and an int never equals a tuple. An int hashes and
compares for a fraction of a tuple's cost; better still, the owner's last-used bucket (see
:class:`Cache`) lets a repeated shape skip the dict and reuse one key object: a hit on it hashes
nothing and makes no key.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Final, TypeAlias

from tensorarena.memory.resource import MemoryResource

__all__ = [
    "ALIGNMENT_BITS",
    "ALIGNMENT_MASK",
    "NO_OWNER",
    "Cache",
    "Key",
    "Shared",
    "bucket_key",
    "key_nbytes",
    "new_cache",
]

#: A bucket key (see the module doc). ``tuple[int, ...]``: mypyc keeps a variable-length tuple as
#: the object it is, where a fixed-length one would be boxed anew at every use.
Key: TypeAlias = int | tuple[int, ...]

ALIGNMENT_BITS: Final = 32
ALIGNMENT_MASK: Final = 0xFFFF_FFFF  #: the largest alignment an int key holds
#: The owner of a retired cache (and of a placeholder): no thread's ident, as idents are unsigned.
NO_OWNER: Final = -1
#: The last-used key of a cache that has none: no bucket has it, so ``is`` never matches a block's.
_NO_KEY: Final[Key] = ()


def bucket_key(nbytes: int, alignment: int) -> Key:
    """The key of the bucket of ``(nbytes, alignment)`` blocks (one pair, one key)."""
    if 0 <= alignment <= ALIGNMENT_MASK:
        return nbytes << ALIGNMENT_BITS | alignment
    return (nbytes, alignment)


def key_nbytes(key: Key) -> int:
    """The ``nbytes`` of a bucket key."""
    if isinstance(key, int):
        return key >> ALIGNMENT_BITS
    return key[0]


class Cache:
    """One thread's cache. The owner thread alone writes ``nbytes``, ``count``, ``hits``,
    ``misses`` and the ``last_*`` fields and touches the lists without a lock; ``lock`` serialises
    drains only.

    ``owner``: the owner thread's ident, :data:`NO_OWNER` once retired (its thread ended): a
    later thread given the same ident must not take a retired cache for its own.

    ``last_*``: the bucket the owner's allocate found last (its shape, key and list), so that a
    repeated shape finds it without hashing, and a put of a block it handed out without either.
    Valid while that list is ``buckets[last_key]``: only the owner's own drains delete buckets (a
    foreign drain never deletes or replaces one), and they :meth:`forget` it first.
    """

    __slots__ = (
        "buckets",
        "count",
        "drained_bytes",
        "drained_count",
        "hits",
        "last_alignment",
        "last_key",
        "last_nbytes",
        "last_stack",
        "lock",
        "misses",
        "nbytes",
        "orphans",
        "owner",
    )

    def __init__(self, owner: int) -> None:
        self.lock = threading.Lock()  # drain lock: taken by drains, never by the hot paths
        self.owner = owner
        self.buckets: dict[Key, list[Any]] = {}  # each list: oldest first, newest last
        self.nbytes = 0  # owner-written: bytes put minus bytes taken by the owner
        self.count = 0
        self.drained_bytes = 0  # drainer-written (under lock): bytes foreign drains took
        self.drained_count = 0
        self.orphans: list[tuple[Any, Key]] = []  # refused blocks with no bucket to go back to
        self.hits = 0
        self.misses = 0
        self.last_nbytes = -1
        self.last_alignment = -1
        self.last_key: Key = _NO_KEY
        self.last_stack: list[Any] = []

    def cached(self) -> tuple[int, int]:
        """``(bytes, blocks)`` held now; exact when no thread is using the cache."""
        return self.nbytes - self.drained_bytes, self.count - self.drained_count

    def forget(self) -> None:
        """Owner (or its drains) only: drop the last-used bucket, before buckets are deleted."""
        self.last_nbytes = -1
        self.last_key = _NO_KEY
        self.last_stack = []

    def adopt_locked(self) -> None:
        """Owner only, lock held: move orphans into buckets (oldest first) and fold the
        drained counters into the owner's, so that they stop growing without bound."""
        self.forget()  # the buckets may have changed under a remembered one
        orphans = self.orphans
        while orphans:
            address, key = orphans.pop()
            self.buckets.setdefault(key, []).insert(0, address)
            # An orphan was counted as drained and uncounted again: the owner now counts it.
        self.nbytes -= self.drained_bytes
        self.count -= self.drained_count
        self.drained_bytes = 0
        self.drained_count = 0


class Shared:
    """What the thread-end finalizers need, without a reference to the adaptor itself."""

    def __init__(self, upstream: MemoryResource) -> None:
        self.upstream = upstream
        self.upstream_lock = threading.Lock()
        self.caches: set[Cache] = set()
        self.caches_lock = threading.Lock()
        self.upstream_allocations = 0
        self.upstream_deallocations = 0
        self.retries = 0
        self.retired_hits = 0  # hits and misses of threads that ended, so totals survive them
        self.retired_misses = 0

    def drain(self, cache: Cache, max_bytes: int, max_blocks: int, *, owned: bool) -> None:
        """Give the cache's oldest blocks back upstream until it is within the bounds.

        ``owned``: the caller is the cache's owner thread, or the owner is dead; otherwise the
        owner may be using the lists concurrently, so only ``pop(0)`` them and drain them all.
        """
        victims: list[tuple[Any, Key]] = []
        with cache.lock:
            if owned:
                cache.adopt_locked()  # forgets the last-used bucket: buckets may go below
                for key in list(cache.buckets):
                    if cache.nbytes <= max_bytes and cache.count <= max_blocks:
                        break
                    stack = cache.buckets[key]
                    nbytes = key_nbytes(key)
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
                        cache.drained_bytes += key_nbytes(key)
                        cache.drained_count += 1
                orphans = cache.orphans
                while orphans:
                    address, key = orphans.pop(0)
                    victims.append((address, key))
                    cache.drained_bytes += key_nbytes(key)
                    cache.drained_count += 1
        if not victims:
            return
        with self.upstream_lock:
            for i, (address, key) in enumerate(victims):
                try:
                    self.upstream.deallocate(address, key_nbytes(key), None)
                except BaseException:
                    self._restore(cache, victims[i:], owned=owned)
                    raise
                self.upstream_deallocations += 1

    @staticmethod
    def _restore(cache: Cache, blocks: list[tuple[Any, Key]], *, owned: bool) -> None:
        # The upstream refused a block it handed out: keep the rest cached rather than lose them.
        with cache.lock:
            for address, key in blocks[::-1]:  # insert(0) in reverse keeps oldest first
                if owned:
                    cache.buckets.setdefault(key, []).insert(0, address)
                    cache.nbytes += key_nbytes(key)
                    cache.count += 1
                    continue
                # Not the owner: never create a bucket (the owner would not see it), and undo
                # the drained count rather than touch the owner's counters.
                stack = cache.buckets.get(key)
                if stack is None:
                    cache.orphans.insert(0, (address, key))
                else:
                    stack.insert(0, address)
                cache.drained_bytes -= key_nbytes(key)
                cache.drained_count -= 1

    def retire(self, cache: Cache) -> None:
        """The thread owning ``cache`` ended: flush it and forget it."""
        # First: a later thread given the same ident must not take this cache for its own.
        cache.owner = NO_OWNER
        try:
            self.drain(cache, 0, 0, owned=True)  # the owner is dead: nobody races the lists
        finally:
            with self.caches_lock:
                self.caches.discard(cache)
                self.retired_hits += cache.hits
                self.retired_misses += cache.misses


# Lives in the thread-local state; its death (the thread ended) flushes the cache. Made with
# type() so that it stays an ordinary Python class in the compiled build: the finalizer needs a
# weak reference to it, which a mypyc native class does not support.
_Token: Any = type("_Token", (), {"__slots__": ("__weakref__",), "__module__": __name__})


def new_cache(shared: Shared, local: threading.local) -> Cache:
    """Make and register the calling thread's cache, kept in ``local`` (its first call)."""
    cache = Cache(threading.get_ident())
    token = _Token()
    with shared.caches_lock:
        shared.caches.add(cache)
    # When the thread ends its thread-local state dies, the token with it, and the finalizer
    # gives the cached blocks back. It references only `shared` and `cache`.
    finalizer = weakref.finalize(token, shared.retire, cache)
    finalizer.atexit = False  # at interpreter exit the upstream is going away too
    local.cache = cache
    local.token = token
    return cache
