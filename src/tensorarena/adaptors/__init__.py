"""Resource adaptors: each wraps any resource (its ``upstream``) and speaks the same protocol.

    ThreadSafe(upstream)              one lock around every call
    ThreadCached(upstream, ...)       per-thread caches of freed small blocks, shared upstream
    Counting(upstream)                requested bytes and allocations: current / peak / total
    Limiting(upstream, limit)         a hard cap on requested bytes
    Logging(upstream, sink=...)       every call recorded, in order (a trace)
    StreamOrdered(upstream, ...)      a freed block waits until the work queued before its free ran

Adaptors nest like the resources they wrap: ``ThreadCached(Limiting(Pool(HostMemory()), ...))``.
Each exposes the protocol (``allocate``, ``deallocate``, ``memory_kind``), its ``upstream`` and
the methods of its own job; nothing is forwarded dynamically.
"""

from tensorarena.adaptors._traffic import TrafficStatistics
from tensorarena.adaptors.counting import Counting
from tensorarena.adaptors.limiting import Limiting
from tensorarena.adaptors.logging import Logging, LogRecord
from tensorarena.adaptors.stream_ordered import StreamOrdered, StreamOrderedStatistics
from tensorarena.adaptors.thread_cached import ThreadCached, ThreadCacheStatistics
from tensorarena.adaptors.thread_safe import ThreadSafe

__all__ = [
    "Counting",
    "Limiting",
    "LogRecord",
    "Logging",
    "StreamOrdered",
    "StreamOrderedStatistics",
    "ThreadCacheStatistics",
    "ThreadCached",
    "ThreadSafe",
    "TrafficStatistics",
]
