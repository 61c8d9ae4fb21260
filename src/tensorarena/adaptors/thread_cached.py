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

Finding the thread's cache. Each thread's cache lives in the thread-local state, but the hot
paths first try the cache used last by any thread (one attribute): it is the caller's own when
its recorded owner ident is the caller's, because idents are unique among live threads and a
cache is retired (its owner set to no thread's ident) while its thread's state is cleared, before
the ident can be handed to a new thread. A thread whose ident differs reads its thread-local
cache and makes it the last used. Within a cache the bucket last found by an allocate is kept
too (its shape, key and list), so a repeated shape hashes nothing; only the owner's drains
delete buckets, and they forget it first.

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

The code is in :mod:`tensorarena.adaptors._thread_cache` (:class:`ThreadCachedCore`), which the
compiled build compiles; this class adds the resource-adaptor base, the context manager, and what
an interpreted class has and a compiled one lacks (weak references, a ``__dict__``).
"""

from __future__ import annotations

from types import TracebackType

from tensorarena.adaptors._thread_cache import ThreadCachedCore, ThreadCacheStatistics
from tensorarena.core.docstrings import restore_class_docstrings
from tensorarena.memory.resource import ResourceAdaptor

restore_class_docstrings("tensorarena.adaptors._thread_cache")  # mypyc drops class docstrings

__all__ = ["ThreadCacheStatistics", "ThreadCached"]


class ThreadCached(ThreadCachedCore, ResourceAdaptor):
    """Per-thread caches of small freed blocks in front of ``upstream`` (see the module doc).

    ``ThreadCached(upstream, *, max_block_size="1MiB", max_cached_bytes="8MiB",
    max_cached_blocks=1024)``: blocks up to ``max_block_size`` are cached, each thread's cache
    trimmed to half its bounds when it holds more than ``max_cached_bytes`` or
    ``max_cached_blocks``.
    """

    def __enter__(self) -> ThreadCached:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
