"""``ThreadSafe``: one lock around every call into a resource, so many threads can share it.

The simplest correct answer to concurrency (RMM's ``thread_safe_resource_adaptor``): every
``allocate``/``deallocate`` runs under one lock. Like RMM's adaptors it exposes the protocol and
its upstream, nothing forwarded dynamically: to ``trim()`` or ``reset()`` a pool below it, call
the pool (a :class:`~tensorarena.memory.Pool` is thread-safe itself), or hold :attr:`lock` to
run several upstream calls as one atomic step. The lock is re-entrant, so nested adaptors that
share it cannot deadlock. Contention is the price; a
:class:`~tensorarena.adaptors.ThreadCached` in front pays it less often.
"""

from __future__ import annotations

import threading

from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)

__all__ = ["ThreadSafe"]


class ThreadSafe(ResourceAdaptor):
    """Serialises every call into ``upstream`` with one lock."""

    def __init__(self, upstream: MemoryResource) -> None:
        self._upstream = check_resource(upstream)
        self._lock = threading.RLock()

    @property
    def upstream(self) -> MemoryResource:
        """The wrapped resource (call it directly only while holding :attr:`lock`)."""
        return self._upstream

    @property
    def lock(self) -> threading.RLock:
        """The lock; hold it to run several calls on the upstream as one atomic step."""
        return self._lock

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate`` under the lock."""
        with self._lock:
            return self._upstream.allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``upstream.deallocate`` under the lock."""
        with self._lock:
            self._upstream.deallocate(address, nbytes, stream)

    def __repr__(self) -> str:
        with self._lock:
            return f"ThreadSafe({self._upstream!r})"
