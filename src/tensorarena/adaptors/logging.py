"""``Logging``: every call into a resource, recorded (RMM's logging adaptor).

Each successful ``allocate`` and ``deallocate``, and each allocation refused for lack of memory,
becomes a :class:`LogRecord` — action, address, bytes, stream, thread and a monotonic time in
nanoseconds — kept in order in memory, or handed to a ``sink`` callable as it happens (a long
recording streams to a file that way instead of growing a list). The adaptor knows nothing of
files or formats: :mod:`tensorarena.trace` turns records into trace events
(``trace.EventRecorder`` as the sink, ``trace.trace_from_log`` for a finished log) and writes
them in any format.

Order is the point of a log, so a record is made under the adaptor's lock together with the
upstream call it records when the order could otherwise break: a free is recorded before another
thread can be handed the same address and record its allocate. A refused call (a double free, a
size mismatch) raises and records nothing, so the log only ever holds what happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import MAX_SIZE, check_address, check_nbytes

__all__ = ["LogRecord", "Logging"]

#: ``LogRecord.action`` of a successful allocate, a successful deallocate, a refused allocate.
ALLOCATE, FREE, ALLOCATE_FAILURE = "allocate", "free", "allocate_failure"


class LogRecord(NamedTuple):
    """One call: ``action`` is ``"allocate"``, ``"free"`` or ``"allocate_failure"`` (then
    ``address`` is 0); ``time_ns`` is ``time.perf_counter_ns()`` when it returned."""

    action: str
    address: int
    nbytes: int
    stream: Stream
    thread: int
    time_ns: int


class Logging(ResourceAdaptor):
    """Wraps ``upstream`` and records every call (see the module docstring).

    ``sink``: called with each :class:`LogRecord` (under the adaptor's lock, so calls never
    interleave); without one, records are kept and read with :attr:`records`. What a sink
    raises reaches the caller: from an allocate, after the block was given back (nothing is
    allocated, nothing recorded); from a deallocate, after the block was freed.
    """

    def __init__(self, upstream: MemoryResource, *,
                 sink: Callable[[LogRecord], object] | None = None) -> None:
        self._upstream = check_resource(upstream)
        if sink is not None and not callable(sink):
            raise InvalidArgumentError(
                f"sink must be a callable taking a LogRecord, not {type(sink).__name__}"
            )
        self._lock = threading.Lock()
        self._records: list[LogRecord] = []
        self._sink: Callable[[LogRecord], object] = self._records.append if sink is None \
            else sink
        self._keeps = sink is None

    @property
    def records(self) -> tuple[LogRecord, ...]:
        """The records so far, oldest first (empty when a sink takes them)."""
        with self._lock:
            return tuple(self._records)

    def clear(self) -> None:
        """Forget the records kept so far."""
        with self._lock:
            self._records.clear()

    def __len__(self) -> int:
        return len(self._records)

    def allocate(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT,
                 stream: Stream = None) -> int:
        """``upstream.allocate``, recorded once it returned (or refused for lack of memory)."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        try:
            address = self._upstream.allocate(nbytes, alignment, stream)
        except MemoryError:
            with self._lock:
                self._sink(LogRecord(ALLOCATE_FAILURE, 0, nbytes, stream,
                                     threading.get_ident(), time.perf_counter_ns()))
            raise
        with self._lock:
            try:
                self._sink(LogRecord(ALLOCATE, address, nbytes, stream, threading.get_ident(),
                                     time.perf_counter_ns()))
            except BaseException:  # the caller never sees the address: give it back
                self._upstream.deallocate(address, nbytes, stream)
                raise
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``upstream.deallocate``, recorded before anyone else can be handed ``address``."""
        if type(address) is not int:
            address = check_address(address)
        if type(nbytes) is not int:
            nbytes = check_nbytes(nbytes)
        with self._lock:
            self._upstream.deallocate(address, nbytes, stream)
            self._sink(LogRecord(FREE, address, nbytes, stream, threading.get_ident(),
                                 time.perf_counter_ns()))

    def __repr__(self) -> str:
        kept = f"records={len(self._records)}" if self._keeps else "sink"
        return f"Logging({self._upstream!r}, {kept})"
