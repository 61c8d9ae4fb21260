"""The trace model: what a program allocated and freed, in order, and the one check of it.

A trace is a sequence of :class:`Event` records. An *allocate* event names a new allocation by
an integer ``id`` (unique among the live ones: an id may come back after its free, as an address
does) and gives its ``nbytes``; a *free* event names a live ``id``. Optional fields: ``stream``
(an integer; 0 is the default stream), ``time_us`` (microseconds from any origin, never
decreasing in a recorded trace but not required to) and ``tag`` (free text: the op or layer that
allocated), ``allocator`` (which allocator served it: ``"torch"``, ``"tensorarena/default"``,
``"tensorarena/pool2"``...; empty when the trace has one) and ``site`` (the Python stack of the
code that allocated, innermost frame first, frames as ``file.py:12 in function`` joined by
``"; "``: :data:`SITE_SEPARATOR`). Every format this package reads comes down to this, and every
format it writes is made from it; addresses (PyTorch's, RMM's) are the formats' business and
become ids on reading.

Events are named tuples, not dataclasses: a replay of a million of them unpacks each one in its
hot loop, and a tuple unpacks several times faster than attribute reads.

:class:`LiveSet` is the single check every reader and :meth:`Trace.from_events` run, one event at
a time, so a file of any length is checked while it streams: an allocate of an id already live,
a free of an id never allocated (or already freed), a free whose size disagrees with its
allocate. A free may leave ``nbytes`` at 0 (formats that do not repeat the size); the check fills
it in, so every event that leaves a reader carries its size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from tensorarena.errors import MalformedTraceError
from tensorarena.sizes import MAX_SIZE

__all__ = [
    "ALLOC",
    "FREE",
    "SITE_SEPARATOR",
    "Event",
    "LiveSet",
    "MalformedTraceError",
    "Trace",
    "TraceSummary",
    "check_events",
    "summarize",
]

#: The ``op`` of an allocate event.
ALLOC = "a"
#: The ``op`` of a free event.
FREE = "f"
#: What joins the frames of an event's ``site``.
SITE_SEPARATOR = "; "


class Event(NamedTuple):
    """One allocation (``op == "a"``) or free (``op == "f"``) of the allocation ``id``."""

    op: str
    id: int
    nbytes: int
    stream: int = 0
    time_us: int | None = None
    tag: str = ""
    allocator: str = ""
    site: str = ""


class LiveSet:
    """The allocations live so far (id → nbytes), checked and updated one event at a time.

    :meth:`check` returns the event with a free's size filled in, or raises
    :class:`MalformedTraceError` at ``line`` and changes nothing. It also keeps the peak of
    live bytes and blocks, so that a reader's caller gets the summary for free.
    """

    __slots__ = ("allocations", "frees", "largest", "live", "live_bytes", "peak_blocks",
                 "peak_bytes", "peak_event", "total_bytes")

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.live_bytes = self.peak_bytes = self.peak_blocks = self.total_bytes = 0
        self.allocations = self.frees = self.largest = 0
        self.peak_event = -1  #: 0-based index of the event where live bytes first peaked

    def check(self, event: Event, line: int | None = None) -> Event:
        """Apply ``event``; return it (a free with its size filled in) or raise, unchanged."""
        op, ident, nbytes = event[0], event[1], event[2]
        live = self.live
        if op == ALLOC:
            if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
                raise MalformedTraceError(
                    f"allocation {ident} has size {nbytes!r}: expected a positive byte count",
                    line=line, column="size",
                )
            if ident in live:
                raise MalformedTraceError(
                    f"allocation id {ident} is allocated again while still live (ids name one "
                    "live allocation at a time)", line=line, column="id",
                )
            live[ident] = nbytes
            self.allocations += 1
            self.total_bytes += nbytes
            if nbytes > self.largest:
                self.largest = nbytes
            self.live_bytes += nbytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
                self.peak_event = self.allocations + self.frees - 1
            if len(live) > self.peak_blocks:
                self.peak_blocks = len(live)
            return event
        if op != FREE:
            raise MalformedTraceError(
                f"unknown op {op!r}: expected 'a' (allocate) or 'f' (free)", line=line, column="op"
            )
        size = live.get(ident)
        if size is None:
            raise MalformedTraceError(
                f"free of allocation id {ident}, which is not live (never allocated, or "
                "already freed)", line=line, column="id",
            )
        if nbytes and nbytes != size:
            raise MalformedTraceError(
                f"free of allocation id {ident} with size {nbytes}, but it was allocated with "
                f"{size}", line=line, column="size",
            )
        del live[ident]
        self.frees += 1
        self.live_bytes -= size
        return event if nbytes else event._replace(nbytes=size)

    def summary(self, *, events: int | None = None, streams: int = 1,
                duration_us: int | None = None) -> TraceSummary:
        """What the events checked so far add up to."""
        return TraceSummary(
            events=self.allocations + self.frees if events is None else events,
            allocations=self.allocations,
            frees=self.frees,
            peak_live_bytes=self.peak_bytes,
            peak_live_blocks=self.peak_blocks,
            total_bytes=self.total_bytes,
            largest_bytes=self.largest,
            live_at_end_bytes=self.live_bytes,
            live_at_end_blocks=len(self.live),
            peak_event=self.peak_event,
            streams=streams,
            duration_us=duration_us,
        )


@dataclass(frozen=True, slots=True)
class TraceSummary:
    """What a trace adds up to. ``peak_live_bytes``: the most bytes live at once (the lower
    bound of every allocator's footprint); ``peak_event``: the 0-based index of the event where
    that peak is first reached; ``live_at_end_*``: allocations never freed."""

    events: int
    allocations: int
    frees: int
    peak_live_bytes: int
    peak_live_blocks: int
    total_bytes: int
    largest_bytes: int
    live_at_end_bytes: int
    live_at_end_blocks: int
    peak_event: int
    streams: int = 1
    duration_us: int | None = None

    def as_dict(self) -> dict[str, int | None]:
        """The summary as plain JSON-ready data."""
        return {name: getattr(self, name) for name in self.__slots__}


def check_events(events: Iterable[Event | tuple[object, ...]], live: LiveSet | None = None
                 ) -> Iterator[Event]:
    """``events`` as checked :class:`Event` objects, one at a time as they are consumed (plain
    tuples in Event's field order are accepted). The edge for events given in memory: raises
    :class:`MalformedTraceError` for something that is not an iterable of events (a path, a
    number) here, and naming the 1-based event number of the first bad event as it is reached.
    A :class:`Trace` was checked when it was made: its events are returned as they are.
    """
    if isinstance(events, Trace):
        return iter(events.events)
    if isinstance(events, (str, bytes)) or hasattr(events, "__fspath__"):
        raise MalformedTraceError(
            f"expected events (a Trace or an iterable of Event), got the path or text "
            f"{events!r}: read it first with read_trace()"
        )
    try:
        iterator = iter(events)
    except TypeError:
        raise MalformedTraceError(
            f"expected events (a Trace or an iterable of Event), got {type(events).__name__}"
        ) from None
    return _checked(iterator, LiveSet() if live is None else live)


def _checked(events: Iterator[Event | tuple[object, ...]], live: LiveSet) -> Iterator[Event]:
    for number, raw in enumerate(events, 1):
        yield live.check(raw if type(raw) is Event else _coerce(raw, number), number)


def summarize(events: Iterable[Event]) -> TraceSummary:
    """Check ``events`` and add them up (one pass; raises on the first fault)."""
    live = LiveSet()
    streams: set[int] = set()
    first = last = None
    for event in check_events(events, live):
        streams.add(event.stream)
        if event.time_us is not None:
            first = event.time_us if first is None else first
            last = event.time_us
    duration = None if first is None or last is None else last - first
    return live.summary(streams=max(len(streams), 1), duration_us=duration)


@dataclass(frozen=True)
class Trace:
    """A checked, immutable sequence of events with a name and free-form metadata (the
    format it came from, what was dropped on reading, how it was recorded).

    Make one with :meth:`from_events` (which checks every event) or a reader
    (:func:`tensorarena.trace.read_trace`); iterate it to get the events.
    """

    events: tuple[Event, ...]
    name: str = "trace"
    metadata: Mapping[str, str] = field(default_factory=dict)
    _summary: TraceSummary | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_events(cls, events: Iterable[Event | tuple[object, ...]], *, name: str = "trace",
                    metadata: Mapping[str, str] | None = None) -> Trace:
        """Check ``events`` (Event or plain tuples in Event's field order) and make a trace.

        Raises :class:`MalformedTraceError` naming the 1-based event number of the first fault.
        """
        if isinstance(events, Trace):  # checked when it was made: its summary holds
            return cls(events.events, name, MappingProxyType(dict(metadata or {})),
                       events.summary())
        live = LiveSet()
        checked = list(check_events(events, live))
        streams = {event.stream for event in checked}
        times = [e.time_us for e in checked if e.time_us is not None]
        summary = live.summary(
            events=len(checked), streams=max(len(streams), 1),
            duration_us=times[-1] - times[0] if times else None,
        )
        return cls(tuple(checked), name, MappingProxyType(dict(metadata or {})), summary)

    def summary(self) -> TraceSummary:
        """Counts, peak live bytes and the like (computed once)."""
        if self._summary is None:
            object.__setattr__(self, "_summary", summarize(self.events))
        assert self._summary is not None
        return self._summary

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        summary = self.summary()
        return (f"Trace({self.name!r}, events={summary.events}, "
                f"peak_live_bytes={summary.peak_live_bytes})")


def _coerce(raw: object, number: int) -> Event:
    """A plain tuple as an Event, its fields checked for type (the edge for in-memory events)."""
    if not isinstance(raw, tuple) or not 3 <= len(raw) <= 8:
        raise MalformedTraceError(
            f"expected an Event or a tuple (op, id, nbytes[, stream, time_us, tag, allocator, "
            f"site]), got {raw!r}",
            line=number,
        )
    op, ident, nbytes, *rest = raw
    if type(ident) is not int or ident < 0:
        raise MalformedTraceError(f"id must be a non-negative int, got {ident!r}", line=number,
                                  column="id")
    if type(nbytes) is not int or nbytes < 0:
        raise MalformedTraceError(f"size must be a non-negative int, got {nbytes!r}",
                                  line=number, column="size")
    event = Event(op, ident, nbytes, *rest)
    if type(event.stream) is not int or (event.time_us is not None
                                         and type(event.time_us) is not int):
        raise MalformedTraceError(f"stream and time_us must be ints, got {raw!r}", line=number)
    for column in ("tag", "allocator", "site"):
        if not isinstance(getattr(event, column), str):
            raise MalformedTraceError(f"{column} must be a string, got "
                                      f"{getattr(event, column)!r}", line=number, column=column)
    return event
