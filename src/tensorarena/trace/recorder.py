"""From a :class:`~tensorarena.adaptors.Logging` adaptor's records to trace events.

The adaptor records addresses, as an allocator sees them; a trace names allocations by id. An
:class:`EventRecorder` is the adaptor's sink: each ``allocate`` opens a new id (0, 1, 2... in
order), each ``free`` closes the id live at its address, and the event goes to its own sink —
a :class:`~tensorarena.trace.CsvWriter` for a recording streamed to disk, or the recorder's
list. Stream objects become small ints (``None`` is 0, an int stays itself, any other stream the
next unused number), times become microseconds since the first record. Refused allocations are
counted (``failures``), not traced: they never held memory.

::

    with CsvWriter("run.csv") as out:
        resource = Logging(Pool(HostMemory()), sink=EventRecorder(out))
        ...                                  # every call is in run.csv once the block ends

or, after the fact, :func:`trace_from_log` on ``Logging(...).records``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tensorarena.adaptors.logging import LogRecord
from tensorarena.trace.model import ALLOC, FREE, Event, LiveSet, MalformedTraceError, Trace

__all__ = ["EventRecorder", "trace_from_log"]


class EventRecorder:
    """A :class:`~tensorarena.adaptors.Logging` sink that turns records into checked events."""

    def __init__(self, sink: Callable[[Event], object] | None = None) -> None:
        self.events: list[Event] = []
        self._sink: Callable[[Event], object] = self.events.append if sink is None else sink
        self._ids: dict[int, int] = {}
        self._streams: dict[int, int] = {}
        self._live = LiveSet()
        self._next_id = 0
        self._start: int | None = None
        self.failures = 0

    def _stream(self, stream: object) -> int:
        if stream is None:
            return 0
        if type(stream) is int:
            return stream
        key = id(stream)
        if key not in self._streams:
            self._streams[key] = max(self._streams.values(), default=0) + 1
        return self._streams[key]

    def __call__(self, record: LogRecord) -> None:
        """Turn one record into an event for the sink (failures are only counted)."""
        action, address, nbytes, stream, _, time_ns = record
        if action == "allocate_failure":
            self.failures += 1
            return
        if self._start is None:
            self._start = time_ns
        time_us = (time_ns - self._start) // 1000
        if action == "allocate":
            ident = self._next_id
            event = Event(ALLOC, ident, nbytes, self._stream(stream), time_us)
            self._live.check(event)
            self._ids[address] = ident
            self._next_id += 1
        elif action == "free":
            if address not in self._ids:
                raise MalformedTraceError(f"free of {address:#x}, which no recorded allocate "
                                          "returned (was the resource used before logging?)")
            event = self._live.check(Event(FREE, self._ids.pop(address), nbytes,
                                           self._stream(stream), time_us))
        else:
            raise MalformedTraceError(f"unknown log action {action!r}")
        self._sink(event)

    def trace(self, *, name: str = "recorded") -> Trace:
        """The events recorded so far as a :class:`Trace` (only when no sink was given)."""
        return Trace.from_events(self.events, name=name,
                                 metadata={"format": "log", "failures": str(self.failures)})


def trace_from_log(records: Iterable[LogRecord], *, name: str = "recorded") -> Trace:
    """A :class:`Trace` of a finished log (``Logging(...).records``)."""
    recorder = EventRecorder()
    for record in records:
        recorder(record)
    return recorder.trace(name=name)
