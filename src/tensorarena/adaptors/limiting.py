"""``Limiting``: a hard cap on the bytes allocated through a resource (RMM's limiting adaptor).

A :class:`~tensorarena.adaptors.Counting` adaptor that refuses: bytes are counted as requested
(each call's ``nbytes``), and the budget is checked and taken under the counter's lock *before*
the upstream call and given back if the upstream fails, so concurrent callers can never
overshoot the limit together, and a refused or failed request leaves the counts as they were.
A request over the limit raises :class:`~tensorarena.errors.OutOfMemoryError` with ``limit`` set
and the requested bytes, so the message says a cap, not the hardware, refused it.
"""

from __future__ import annotations

from tensorarena.adaptors._traffic import TrafficStatistics
from tensorarena.adaptors.counting import Counting
from tensorarena.errors import OutOfMemoryError
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.sizes import (
    ALIGNMENTS,
    MAX_SIZE,
    Size,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)

__all__ = ["Limiting"]


class Limiting(Counting):
    """Refuses any allocation that would take the bytes requested through it above ``limit``."""

    def __init__(self, upstream: MemoryResource, limit: Size) -> None:
        super().__init__(upstream)
        self._limit = parse_size(limit, name="limit", allow_zero=True)

    @property
    def limit(self) -> int:
        """The cap in bytes."""
        return self._limit

    @property
    def requested_bytes(self) -> int:
        """Bytes requested through this adaptor and not yet freed."""
        return self._traffic.nbytes

    @property
    def available_bytes(self) -> int:
        """Bytes that may still be requested before the limit."""
        return self._limit - self._traffic.nbytes

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate`` if ``nbytes`` fits under the limit, else OutOfMemoryError."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment not in ALIGNMENTS:
            alignment = check_alignment(alignment)
        traffic = self._traffic
        with self._lock:
            requested = traffic.nbytes
            if requested + nbytes > self._limit:
                traffic.ooms += 1
                available = self._limit - requested
                raise OutOfMemoryError(
                    nbytes,
                    free=available,
                    largest_free=available,
                    capacity=self._limit,
                    limit=self._limit,
                    allocated=requested,
                    detail=f"Limiting adaptor over {type(self._upstream).__name__}",
                )
            before = traffic.snapshot()
            traffic.allocated(nbytes)  # taken before the call: no two callers overshoot
        try:
            return self._upstream.allocate(nbytes, alignment, stream)
        except BaseException as exc:
            with self._lock:
                traffic.undo(nbytes, before, oom=isinstance(exc, MemoryError))
            raise

    def statistics(self) -> TrafficStatistics:
        """A frozen snapshot of the requested bytes and allocations, with the limit."""
        with self._lock:
            return self._traffic.snapshot(limit=self._limit)

    def __repr__(self) -> str:
        return (
            f"Limiting({self._upstream!r}, limit={format_size(self._limit)}, "
            f"requested={format_size(self._traffic.nbytes)})"
        )
