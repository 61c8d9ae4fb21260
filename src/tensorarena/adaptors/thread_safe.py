"""``ThreadSafe``: one lock around every call into a resource, so many threads can share it.

The simplest correct answer to concurrency (RMM's ``thread_safe_resource_adaptor``): every
``allocate``/``deallocate`` and every other public method reached through the adaptor runs under
one lock. Contention is the price; :class:`~tensorarena.adaptors.ThreadCached` in front of it
pays it less often. The lock is re-entrant, so a forwarded method that calls back into the
adaptor (or a nested adaptor sharing the lock) cannot deadlock.
"""

from __future__ import annotations

import threading
from functools import wraps
from typing import Any

from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream

__all__ = ["ThreadSafe"]


class ThreadSafe:
    """Serialises every call into ``upstream`` with one lock."""

    def __init__(self, upstream: MemoryResource) -> None:
        if not callable(getattr(upstream, "allocate", None)):
            raise TypeError(f"upstream must be a memory resource, not {type(upstream).__name__}")
        self._upstream = upstream
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

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined here: forward to the upstream, and wrap methods so
        # that statistics(), trim(), reset()... run under the same lock as allocate().
        if name.startswith("__") or name in ("_upstream", "_lock"):
            raise AttributeError(name)
        with self._lock:  # a property may compute from state another thread is changing
            attribute = getattr(self._upstream, name)
        if not callable(attribute):
            return attribute
        lock = self._lock

        @wraps(attribute)
        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return attribute(*args, **kwargs)

        return locked

    def __len__(self) -> int:
        with self._lock:
            return len(self._upstream)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        with self._lock:
            return f"ThreadSafe({self._upstream!r})"

