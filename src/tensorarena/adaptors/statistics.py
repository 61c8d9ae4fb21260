"""``Statistics``: counts and bytes of what passes through any resource (RMM's statistics adaptor).

It counts the bytes *requested* (the ``nbytes`` of each call), current, peak and total, and the
number of allocations likewise. A counter changes only after the upstream call succeeded, so a
failing allocate or deallocate leaves the statistics as they were. The counters have their own
small lock: the adaptor may sit above a thread-safe upstream and be called from many threads.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.sizes import format_size

__all__ = ["AllocationStatistics", "Statistics"]


@dataclass(frozen=True, slots=True)
class AllocationStatistics:
    """A snapshot of the traffic through a :class:`Statistics` adaptor (bytes as requested)."""

    allocated_bytes: int  #: bytes of the blocks live now
    peak_allocated_bytes: int
    total_allocated_bytes: int  #: bytes of every allocation since creation
    total_freed_bytes: int
    allocation_count: int  #: blocks live now
    peak_allocation_count: int
    total_allocations: int
    total_deallocations: int


class Statistics:
    """Wraps ``upstream`` and counts its allocations; :meth:`statistics` returns a snapshot."""

    def __init__(self, upstream: MemoryResource) -> None:
        if not callable(getattr(upstream, "allocate", None)):
            raise TypeError(f"upstream must be a memory resource, not {type(upstream).__name__}")
        self._upstream = upstream
        self._lock = threading.Lock()
        self._bytes = self._peak_bytes = self._total_bytes = self._freed_bytes = 0
        self._count = self._peak_count = self._total_count = self._freed_count = 0

    @property
    def upstream(self) -> MemoryResource:
        """The wrapped resource."""
        return self._upstream

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate``, counted once it succeeded."""
        address = self._upstream.allocate(nbytes, alignment, stream)
        with self._lock:
            self._bytes += nbytes
            self._total_bytes += nbytes
            self._count += 1
            self._total_count += 1
            if self._bytes > self._peak_bytes:
                self._peak_bytes = self._bytes
            if self._count > self._peak_count:
                self._peak_count = self._count
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``upstream.deallocate``, counted once it succeeded."""
        self._upstream.deallocate(address, nbytes, stream)
        with self._lock:
            self._bytes -= nbytes
            self._freed_bytes += nbytes
            self._count -= 1
            self._freed_count += 1

    def statistics(self) -> AllocationStatistics:
        """A frozen snapshot of the counters."""
        with self._lock:
            return AllocationStatistics(
                allocated_bytes=self._bytes,
                peak_allocated_bytes=self._peak_bytes,
                total_allocated_bytes=self._total_bytes,
                total_freed_bytes=self._freed_bytes,
                allocation_count=self._count,
                peak_allocation_count=self._peak_count,
                total_allocations=self._total_count,
                total_deallocations=self._freed_count,
            )

    def reset_peaks(self) -> None:
        """Set every peak to its current value (as ``torch.cuda.reset_peak_memory_stats``)."""
        with self._lock:
            self._peak_bytes = self._bytes
            self._peak_count = self._count

    def __repr__(self) -> str:
        return (
            f"Statistics({self._upstream!r}, allocated={format_size(self._bytes)}, "
            f"live={self._count}, peak={format_size(self._peak_bytes)})"
        )
