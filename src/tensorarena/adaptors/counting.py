"""``Counting``: what passes through any resource, counted (RMM's statistics adaptor).

It counts the bytes *requested* (each call's ``nbytes``) and the allocations, current, peak and
total, and the requests refused for lack of memory, in the vocabulary of :mod:`tensorarena.stats`.
A counter changes only after the upstream call succeeded, so a failing allocate or deallocate
leaves the counts as they were. Sizes and addresses are normalised at this edge (``"4KiB"``,
``np.int64``) before the upstream sees them. The counters have their own small lock: the adaptor
may sit above a thread-safe upstream and be called from many threads.
"""

from __future__ import annotations

import threading

from tensorarena.adaptors._traffic import Traffic, TrafficStatistics
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import MAX_SIZE, check_address, check_nbytes, format_size

__all__ = ["Counting", "TrafficStatistics"]


class Counting(ResourceAdaptor):
    """Wraps ``upstream`` and counts its traffic; :meth:`statistics` returns a snapshot."""

    def __init__(self, upstream: MemoryResource) -> None:
        self._upstream = check_resource(upstream)
        self._lock = threading.Lock()
        self._traffic = Traffic()

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate``, counted once it succeeded."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        try:
            address = self._upstream.allocate(nbytes, alignment, stream)
        except MemoryError:
            with self._lock:
                self._traffic.ooms += 1
            raise
        with self._lock:
            self._traffic.allocated(nbytes)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``upstream.deallocate``, counted once it succeeded."""
        if type(address) is not int:
            address = check_address(address)
        if type(nbytes) is not int:
            nbytes = check_nbytes(nbytes)
        self._upstream.deallocate(address, nbytes, stream)
        with self._lock:
            self._traffic.freed(nbytes)

    def statistics(self) -> TrafficStatistics:
        """A frozen snapshot of the counters."""
        with self._lock:
            return self._traffic.snapshot()

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value (as ``torch.cuda.reset_peak_memory_stats``)."""
        with self._lock:
            self._traffic.reset_peaks()

    def __repr__(self) -> str:
        traffic = self._traffic
        return (
            f"Counting({self._upstream!r}, requested={format_size(traffic.nbytes)}, "
            f"live={traffic.blocks}, peak={format_size(traffic.peak_nbytes)})"
        )
