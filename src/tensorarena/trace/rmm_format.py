"""RMM's logging CSV, both ways: what ``rmm::mr::logging_resource_adaptor`` writes.

::

    Thread,Time,Action,Pointer,Size,Stream
    140573312345856,08:23:11.123456,allocate,0x7f8a40000000,1024,0x0
    140573312345856,08:23:11.234567,free,0x7f8a40000000,1024,0x0

``Time`` is the wall-clock time of day with microseconds (spdlog's ``%H:%M:%S.%f``); seconds
since the epoch (``1634567890.123456``, as RMM's documentation shows) are read too. ``Action``
is ``allocate`` or ``free``; ``allocate failure`` rows (newer RMM) are skipped, counted by the
:class:`RmmReadStats` a caller may pass. ``Pointer`` and ``Stream`` are hexadecimal (``0x``
optional; a decimal stream is read as such).

Reading turns addresses into ids: each ``allocate`` opens a new id (0, 1, 2... in order), and a
``free`` names the live allocation at its address, which must exist: RMM logs every call made
through the adaptor, so a free of an unknown pointer means a corrupt or truncated log. The time
of day becomes ``time_us`` (microseconds since midnight; a log that runs past midnight keeps
counting up). The ``Thread`` column has no place in the trace model and is dropped; writing puts
0 there. Writing gives every allocation an address of its own (never reused), so reading the
file back gives the same events with ids in allocation order.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tensorarena.trace._text import Source, int_cell, open_lines, source_name
from tensorarena.trace.atomic import atomic_text
from tensorarena.trace.model import (
    ALLOC,
    FREE,
    Event,
    LiveSet,
    MalformedTraceError,
    check_events,
)

__all__ = ["RMM_HEADER", "RmmReadStats", "iter_rmm", "write_rmm"]

RMM_HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
_DAY_US = 86_400_000_000
_BASE_ADDRESS = 0x7F0000000000
_SKIPPED_ACTIONS = ("allocate failure", "allocate_failure")


@dataclass
class RmmReadStats:
    """What a read dropped: ``failures`` (``allocate failure`` rows)."""

    failures: int = 0


def _time_us(text: str, line: int) -> int:
    """``HH:MM:SS.ffffff`` (time of day) or seconds since the epoch, as microseconds."""
    stripped = text.strip()
    try:
        if ":" in stripped:
            hours, minutes, seconds = stripped.split(":")
            whole, _, fraction = seconds.partition(".")
            micros = int((fraction + "000000")[:6]) if fraction else 0
            return ((int(hours) * 60 + int(minutes)) * 60 + int(whole)) * 1_000_000 + micros
        whole, _, fraction = stripped.partition(".")
        return int(whole) * 1_000_000 + (int((fraction + "000000")[:6]) if fraction else 0)
    except ValueError:
        raise MalformedTraceError(
            f"time {stripped!r:.40} is neither HH:MM:SS.ffffff nor seconds", line=line,
            column="Time") from None


def iter_rmm(source: Source, *, live: LiveSet | None = None,
             stats: RmmReadStats | None = None) -> Iterator[Event]:
    """Stream the checked events of an RMM log (see the module docstring)."""
    live = LiveSet() if live is None else live
    stats = RmmReadStats() if stats is None else stats
    name = source_name(source)
    with open_lines(source) as lines:
        reader = csv.reader(lines)
        header = next(reader, None)
        cells = [c.strip().lower() for c in header or []]
        wanted = [c.lower() for c in RMM_HEADER]
        missing = [c for c in wanted if c not in cells]
        if missing:
            raise MalformedTraceError(
                f"{name}: not an RMM log: missing column(s) {', '.join(missing)} (the header is "
                f"{','.join(RMM_HEADER)})", line=1, column=missing[0])
        i_time, i_action, i_pointer, i_size, i_stream = (
            cells.index(c) for c in wanted[1:])
        width = len(cells)
        ids: dict[int, int] = {}  # live address -> id
        next_id = 0
        day = last_time = 0
        while True:
            try:
                row = next(reader, None)
            except csv.Error as exc:
                raise MalformedTraceError(f"{name}: {exc}", line=reader.line_num) from None
            if row is None:
                return
            line = reader.line_num
            if len(row) != width:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                raise MalformedTraceError(f"{name}: {len(row)} fields, the header has {width}",
                                          line=line)
            action = row[i_action].strip().lower()
            if action in _SKIPPED_ACTIONS:
                stats.failures += 1
                continue
            pointer = int_cell(row[i_pointer], line=line, column="Pointer", base=16)
            nbytes = int_cell(row[i_size], line=line, column="Size")
            text = row[i_stream].strip()
            stream = int_cell(text, line=line, column="Stream",
                              base=16 if text[:2].lower() == "0x" else 10) if text else 0
            time_us = _time_us(row[i_time], line) + day
            if time_us + 12 * 3_600_000_000 < last_time:  # the log ran past midnight
                day += _DAY_US
                time_us += _DAY_US
            last_time = time_us
            if action == "allocate":
                if pointer in ids:
                    raise MalformedTraceError(
                        f"allocate at {pointer:#x}, which is still live (no free in between)",
                        line=line, column="Pointer")
                event = live.check(Event(ALLOC, next_id, nbytes, stream, time_us), line)
                ids[pointer] = next_id
                next_id += 1
            elif action == "free":
                ident = ids.get(pointer)
                if ident is None:
                    raise MalformedTraceError(
                        f"free of {pointer:#x}, which no allocate in this log returned (is the "
                        "log truncated?)", line=line, column="Pointer")
                event = live.check(Event(FREE, ident, nbytes, stream, time_us), line)
                del ids[pointer]
            else:
                raise MalformedTraceError(
                    f"action {action!r:.30} is neither 'allocate' nor 'free'", line=line,
                    column="Action")
            yield event


def _clock(time_us: int | None) -> str:
    micros = (time_us or 0) % _DAY_US
    seconds, micros = divmod(micros, 1_000_000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{micros:06d}"


def _rows(events: Iterable[Event]) -> Iterator[tuple[object, ...]]:
    addresses: dict[int, int] = {}
    cursor = _BASE_ADDRESS
    for op, ident, nbytes, stream, time_us, _, _, _ in events:
        if op == ALLOC:
            address = addresses[ident] = cursor
            cursor += (nbytes + 255) & -256  # 256-aligned, as RMM hands out
            action = "allocate"
        else:
            address = addresses.pop(ident)
            action = "free"
        yield 0, _clock(time_us), action, f"{address:#x}", nbytes, f"{stream:#x}"


def write_rmm(events: Iterable[Event], path: str | os.PathLike[str]) -> None:
    """Write checked ``events`` (a :class:`~tensorarena.trace.Trace`, or events a reader made)
    to ``path`` as an RMM log, atomically. Times past 24 h wrap, as a time of day does."""
    events = check_events(events)
    with atomic_text(path) as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(RMM_HEADER)
        writer.writerows(_rows(events))
