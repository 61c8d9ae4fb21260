"""Replay a trace on any resource and say what it cost: footprint, fragmentation, time.

:func:`replay` drives ``resource.allocate``/``deallocate`` in the trace's order and returns a
frozen :class:`ReplayResult`:

* ``peak_live_bytes`` — the most bytes the trace holds at once: no allocator can do with less;
* ``peak_reserved_bytes`` / ``end_reserved_bytes`` — what the resource held from its upstream
  at its worst and when the trace ended (what a long-running server keeps), read from the first
  :class:`~tensorarena.stats.MemoryStatistics` of the resource's stack (a pool under adaptors);
* ``footprint_ratio`` — peak reserved over peak live (1.0 is perfect);
* ``steady_footprint_ratio`` — for a resource that learns (``learned``), peak reserved from the
  first step it served from a plan on, over peak live; ``None`` for the others;
* ``fragmentation`` — ``1 - largest_free / free`` of the resource at the moment the live bytes
  first peak;
* ``upstream_allocs``/``upstream_frees``, ``failures`` (allocations refused for lack of memory:
  skipped, and so is their free), ``seconds`` and ``ns_per_op``.

Sources: a :class:`~tensorarena.trace.Trace`, a file (streamed: memory stays proportional to
what is live, not to the file — the file is read twice, once to find the peak and once to
replay), or any iterable of events (checked, and held, first). The loop is one tuple unpack, one
call and one dict operation per event; the statistics are read once, at the peak, by splitting
the loop there, so the timed part does nothing else. What the replay allocated and the trace
never freed is freed at the end (and on any error), so the resource is left as it was found.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tensorarena.memory.resource import MemoryResource, check_resource, resource_stack
from tensorarena.stats import MemoryStatistics
from tensorarena.trace._text import Source, is_path
from tensorarena.trace.formats import Format, iter_events
from tensorarena.trace.model import ALLOC, Event, LiveSet, MalformedTraceError, Trace

__all__ = ["ReplayResult", "replay", "statistics_of"]

_PROGRESS_EVERY = 1 << 16


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What one replay measured (see the module docstring). Sizes in bytes; ``None`` where the
    resource keeps no :class:`~tensorarena.stats.MemoryStatistics`."""

    name: str
    events: int
    allocations: int
    frees: int
    failures: int
    peak_live_bytes: int
    end_live_bytes: int
    peak_reserved_bytes: int | None
    end_reserved_bytes: int | None
    fragmentation: float | None
    upstream_allocs: int | None
    upstream_frees: int | None
    seconds: float
    #: peak reserved during the steps served from a learned plan (``None``: not measured)
    steady_reserved_bytes: int | None = None

    @property
    def footprint_ratio(self) -> float | None:
        """Peak reserved over peak live bytes (1.0: the allocator wasted nothing)."""
        if self.peak_reserved_bytes is None or not self.peak_live_bytes:
            return None
        return self.peak_reserved_bytes / self.peak_live_bytes

    @property
    def steady_footprint_ratio(self) -> float | None:
        """Peak reserved during the repeated (planned) steps over peak live bytes."""
        if self.steady_reserved_bytes is None or not self.peak_live_bytes:
            return None
        return self.steady_reserved_bytes / self.peak_live_bytes

    @property
    def end_footprint_ratio(self) -> float | None:
        """Reserved bytes when the trace ended over its peak live bytes."""
        if self.end_reserved_bytes is None or not self.peak_live_bytes:
            return None
        return self.end_reserved_bytes / self.peak_live_bytes

    @property
    def ns_per_op(self) -> float:
        """Wall time per event of the replay loop."""
        return self.seconds * 1e9 / self.events if self.events else 0.0

    @property
    def events_per_second(self) -> float:
        """Events replayed per second."""
        return self.events / self.seconds if self.seconds else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data: the keys of ``tensorarena replay --json``."""
        ratio = self.footprint_ratio
        return {
            "peak_reserved": self.peak_reserved_bytes,
            "footprint_ratio": None if ratio is None else round(ratio, 6),
            "fragmentation": None if self.fragmentation is None else round(self.fragmentation,
                                                                           6),
            "ns_per_op": round(self.ns_per_op, 1),
            "failures": self.failures,
            "end_reserved": self.end_reserved_bytes,
            "end_footprint_ratio": None if self.end_footprint_ratio is None
            else round(self.end_footprint_ratio, 6),
            "upstream_allocs": self.upstream_allocs,
            "upstream_frees": self.upstream_frees,
            "events_per_second": round(self.events_per_second, 1),
            "steady_footprint_ratio": None if self.steady_footprint_ratio is None
            else round(self.steady_footprint_ratio, 6),
        }


def statistics_of(resource: object) -> MemoryStatistics | None:
    """The first :class:`~tensorarena.stats.MemoryStatistics` down ``resource``'s stack
    (the resource, its ``upstream``, that one's...), or ``None``."""
    for layer in resource_stack(resource):
        method = getattr(layer, "statistics", None)
        if callable(method):
            stats = method()
            if isinstance(stats, MemoryStatistics):
                return stats
    return None


def _progress(events: Iterable[Event], total: int | None) -> Iterator[Event]:
    """``events``, with a count on stderr every 65536 of them (only on a terminal)."""
    began = time.perf_counter()
    for count, event in enumerate(events, 1):
        if not count % _PROGRESS_EVERY:
            rate = count / (time.perf_counter() - began)
            of = f"/{total}" if total else ""
            print(f"\rreplayed {count}{of} events ({rate:,.0f}/s)", end="", file=sys.stderr,
                  flush=True)
        yield event
    print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)


class _Loop:
    """The replay's state across the two halves of the loop (before and after the peak)."""

    def __init__(self, resource: MemoryResource, alignment: int, streams: bool) -> None:
        self.allocate = resource.allocate
        self.deallocate = resource.deallocate
        self.alignment = alignment
        self.streams = streams
        self.live: dict[int, tuple[int, int]] = {}  # id -> (address, nbytes)
        self.failed: set[int] = set()
        self.events = self.allocations = self.failures = 0
        self.level = self.peak = 0

    def run(self, events: Iterable[Event]) -> None:
        allocate, deallocate, alignment = self.allocate, self.deallocate, self.alignment
        live, streams = self.live, self.streams
        level, peak, count, allocations = self.level, self.peak, self.events, self.allocations
        try:
            for op, ident, nbytes, stream, _, _ in events:
                count += 1
                if op == ALLOC:
                    allocations += 1
                    level += nbytes
                    if level > peak:
                        peak = level
                    try:
                        live[ident] = (allocate(nbytes, alignment, stream if streams else None),
                                       nbytes)
                    except MemoryError:
                        self.failures += 1
                        self.failed.add(ident)
                else:
                    level -= nbytes
                    entry = live.pop(ident, None)
                    if entry is None:
                        if ident in self.failed:
                            self.failed.discard(ident)
                            continue
                        raise MalformedTraceError(f"free of allocation id {ident}, which is "
                                                  "not live", line=count, column="id")
                    deallocate(entry[0], entry[1], stream if streams else None)
        finally:
            self.level, self.peak, self.events, self.allocations = level, peak, count, allocations

    def release(self) -> BaseException | None:
        """Free whatever is still live (the trace's leaks, or everything after an error), each
        block even when freeing another raised; return the first such error."""
        first: BaseException | None = None
        for address, nbytes in self.live.values():
            try:
                self.deallocate(address, nbytes, None)
            except Exception as exc:  # the others are still ours to give back
                first = first or exc
        self.live.clear()
        return first


def replay(source: Trace | Source | Iterable[Event], resource: MemoryResource, *,
           name: str | None = None, alignment: int = 256, streams: bool = False,
           format: Format | None = None, progress: bool = False) -> ReplayResult:
    """Replay ``source`` on ``resource``; see the module docstring for what is measured.

    ``streams=True`` passes each event's stream number to the resource (for resources that keep
    streams apart, such as :class:`~tensorarena.trace.PyTorchLike`); by default every call is on
    the default stream (``None``). ``progress`` prints a count on stderr, on a terminal only.
    """
    resource = check_resource(resource, name="resource")
    if isinstance(source, Trace):
        peak_event, total, events = source.summary().peak_event, len(source), iter(source)
    elif isinstance(source, (str, bytes)) or hasattr(source, "__fspath__") or hasattr(
            source, "read"):
        if not is_path(source):  # a text or a stream cannot be read twice: hold it
            source = Trace.from_events(iter_events(source, format=format))  # type: ignore[arg-type]
            return replay(source, resource, name=name, alignment=alignment, streams=streams,
                          progress=progress)
        first = LiveSet()
        for _ in iter_events(source, format=format, live=first):  # type: ignore[arg-type]
            pass
        peak_event, total = first.peak_event, first.allocations + first.frees
        events = iter_events(source, format=format)  # type: ignore[arg-type]
    else:  # events from memory: checked (and held) once, which also finds the peak
        source = Trace.from_events(source)
        peak_event, total, events = source.summary().peak_event, len(source), iter(source)
    if progress and sys.stderr.isatty():
        events = _progress(events, total)
    loop = _Loop(resource, alignment, streams)
    at_peak: MemoryStatistics | None = None
    try:
        began = time.perf_counter()
        loop.run(itertools.islice(events, peak_event + 1))
        sampling = time.perf_counter()
        at_peak = statistics_of(resource)
        sampling = time.perf_counter() - sampling
        loop.run(events)
        seconds = time.perf_counter() - began - sampling
        end = statistics_of(resource)
    finally:
        error = loop.release()  # raised below only when the replay itself did not raise
    if error is not None:
        raise error
    return ReplayResult(
        name=name or type(resource).__name__,
        events=loop.events,
        allocations=loop.allocations,
        frees=loop.events - loop.allocations,
        failures=loop.failures,
        peak_live_bytes=loop.peak,
        end_live_bytes=loop.level,
        peak_reserved_bytes=None if end is None else end.reserved_bytes.peak,
        end_reserved_bytes=None if end is None else end.reserved_bytes.current,
        fragmentation=None if at_peak is None else at_peak.fragmentation,
        upstream_allocs=None if end is None else end.num_upstream_allocs,
        upstream_frees=None if end is None else end.num_upstream_frees,
        seconds=seconds,
    )
