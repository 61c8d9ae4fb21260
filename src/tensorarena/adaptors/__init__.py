"""Resource adaptors: each wraps any resource (its ``upstream``) and speaks the same protocol.

    ThreadSafe(upstream)              one lock around every call
    ThreadCached(upstream, ...)       per-thread caches of freed small blocks, shared upstream
    Statistics(upstream)              current / peak / total bytes and counts
    Limiting(upstream, limit)         a hard cap on allocated bytes

Adaptors nest like the resources they wrap: ``ThreadCached(ThreadSafe(Pool(HostMemory())))``.
"""

from tensorarena.adaptors.limiting import Limiting
from tensorarena.adaptors.statistics import AllocationStatistics, Statistics
from tensorarena.adaptors.thread_cached import ThreadCached, ThreadCacheStatistics
from tensorarena.adaptors.thread_safe import ThreadSafe

__all__ = [
    "AllocationStatistics",
    "Limiting",
    "Statistics",
    "ThreadCacheStatistics",
    "ThreadCached",
    "ThreadSafe",
]
