"""``Limiting``: a hard cap on the bytes allocated through a resource (RMM's limiting adaptor).

Bytes are counted as requested (each call's ``nbytes``). The budget is checked and taken under a
small lock *before* the upstream call and given back if the upstream fails, so concurrent callers
can never overshoot the limit together, and a refused or failed request leaves the count as it
was. A request over the limit raises :class:`~tensorarena.errors.OutOfMemoryError` with
``limit`` set and the allocated bytes, so the message says a cap, not the hardware, refused it.
"""

from __future__ import annotations

import threading

from tensorarena.errors import OutOfMemoryError
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.sizes import MAX_SIZE, Size, check_nbytes, format_size, parse_size

__all__ = ["Limiting"]


class Limiting:
    """Refuses any allocation that would take the bytes allocated through it above ``limit``."""

    def __init__(self, upstream: MemoryResource, limit: Size) -> None:
        if not callable(getattr(upstream, "allocate", None)):
            raise TypeError(f"upstream must be a memory resource, not {type(upstream).__name__}")
        self._upstream = upstream
        self._limit = parse_size(limit, name="limit", allow_zero=True)
        self._allocated = 0
        self._lock = threading.Lock()

    @property
    def upstream(self) -> MemoryResource:
        """The wrapped resource."""
        return self._upstream

    @property
    def limit(self) -> int:
        """The cap in bytes."""
        return self._limit

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated through this adaptor and not yet freed."""
        return self._allocated

    @property
    def available_bytes(self) -> int:
        """Bytes that may still be allocated before the limit."""
        return self._limit - self._allocated

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate`` if ``nbytes`` fits under the limit, else OutOfMemoryError."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        with self._lock:
            allocated = self._allocated
            if allocated + nbytes > self._limit:
                available = self._limit - allocated
                raise OutOfMemoryError(
                    nbytes,
                    free=available,
                    largest_free=available,
                    capacity=self._limit,
                    limit=self._limit,
                    allocated=allocated,
                    detail=f"Limiting adaptor over {type(self._upstream).__name__}",
                )
            self._allocated = allocated + nbytes
        try:
            return self._upstream.allocate(nbytes, alignment, stream)
        except BaseException:
            with self._lock:
                self._allocated -= nbytes
            raise

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``upstream.deallocate``; the bytes count again once the upstream took the block."""
        self._upstream.deallocate(address, nbytes, stream)
        with self._lock:
            self._allocated -= nbytes

    def __repr__(self) -> str:
        return (
            f"Limiting({self._upstream!r}, limit={format_size(self._limit)}, "
            f"allocated={format_size(self._allocated)})"
        )
