"""Resource adaptors: each wraps any resource (its ``upstream``) and speaks the same protocol.

    ThreadSafe(upstream)              one lock around every call
    ThreadCached(upstream, ...)       per-thread caches of freed small blocks, shared upstream
    Counting(upstream)                requested bytes and allocations: current / peak / total
    Limiting(upstream, limit)         a hard cap on requested bytes
    Logging(upstream, sink=...)       every call recorded, in order (a trace)
    StreamOrdered(upstream, ...)      a freed block waits until the work queued before its free ran
    Tracking(upstream, ...)           every live allocation and its stack: leak reports, OOM sites
    Guarded(upstream, ...)            canary red zones (and guard pages) catch buffer overflows
    Poisoning(upstream, ...)          freed blocks poisoned and quarantined catch use after free

Adaptors nest like the resources they wrap: ``ThreadCached(Limiting(Pool(HostMemory()), ...))``.
Each exposes the protocol (``allocate``, ``deallocate``, ``memory_kind``), its ``upstream`` and
the methods of its own job; nothing is forwarded dynamically.
"""

from tensorarena.adaptors._traffic import TrafficStatistics
from tensorarena.adaptors.counting import Counting
from tensorarena.adaptors.guarded import Guarded, GuardedStatistics
from tensorarena.adaptors.limiting import Limiting
from tensorarena.adaptors.logging import Logging, LogRecord
from tensorarena.adaptors.poisoning import Poisoning, PoisoningStatistics
from tensorarena.adaptors.stream_ordered import StreamOrdered, StreamOrderedStatistics
from tensorarena.adaptors.thread_cached import ThreadCached, ThreadCacheStatistics
from tensorarena.adaptors.thread_safe import ThreadSafe
from tensorarena.adaptors.tracking import (
    LeakReport,
    SiteReport,
    TrackedAllocation,
    Tracking,
)

__all__ = [
    "Counting",
    "Guarded",
    "GuardedStatistics",
    "LeakReport",
    "Limiting",
    "LogRecord",
    "Logging",
    "Poisoning",
    "PoisoningStatistics",
    "SiteReport",
    "StreamOrdered",
    "StreamOrderedStatistics",
    "ThreadCacheStatistics",
    "ThreadCached",
    "ThreadSafe",
    "TrackedAllocation",
    "Tracking",
    "TrafficStatistics",
]
