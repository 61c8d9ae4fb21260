"""Our CSV trace format: one event a row, the minimal form being ``op,id,size``.

::

    # tensorarena trace, version 2
    op,id,size,stream,time_us,tag,allocator,site
    a,0,4096,0,12,aten::empty,torch,train.py:30 in step; train.py:51 in main
    a,1,512,0,15,,tensorarena/default,train.py:33 in step
    f,0,4096,0,20,,torch,

``op`` is ``a`` (allocate) or ``f`` (free); ``id`` a non-negative integer naming one live
allocation; ``size`` its bytes (a free may leave it empty or 0: the reader fills it in from the
allocate). ``stream`` (default 0), ``time_us`` (empty: unknown), ``tag``, ``allocator`` (which
allocator served it) and ``site`` (its Python stack) are optional columns, in any order after the
header. Numbers are ASCII digits (``int()`` alone would take ``"١٢"`` and ``"1_000"``).

Version 2 added ``allocator`` and ``site``: a file is written as version 1 when it uses neither,
so that older readers still read it, and every version-1 file reads as it always did. The version
line is written by :func:`write_csv` and optional on reading (a file of a later version is
refused: it may mean something we do not know); other lines starting with ``#`` and blank lines
are skipped. Unknown columns are refused rather than silently ignored, so a misspelt ``time_us``
is not lost.

Reading streams (:func:`iter_csv`); every fault is a
:class:`~tensorarena.trace.model.MalformedTraceError` with its line and column. Writing is atomic
(:mod:`tensorarena.trace.atomic`), either all at once (:func:`write_csv`) or event by event
(:class:`CsvWriter`, the sink a long recording writes through).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from types import TracebackType
from typing import IO

from tensorarena.sizes import INTEGER_TEXT
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

__all__ = ["COLUMNS", "FORMAT_VERSION", "CsvWriter", "iter_csv", "write_csv"]

#: The newest version this module writes and reads.
FORMAT_VERSION = 2
#: Every column, in the order they are written.
COLUMNS = ("op", "id", "size", "stream", "time_us", "tag", "allocator", "site")
_REQUIRED = ("op", "id", "size")
_SINCE_2 = ("allocator", "site")  # a file with neither is written as version 1
_NUMBERS = ("id", "size", "stream", "time_us")


def _version_line(columns: Iterable[str]) -> str:
    version = FORMAT_VERSION if any(c in _SINCE_2 for c in columns) else 1
    return f"# tensorarena trace, version {version}\n"

_PARTIAL = "# partial: "
_VERSION_RE = re.compile(r"^#\s*tensorarena trace, version (\d+)\s*$")


def _header(lines: Iterator[str], name: str) -> tuple[dict[str, int], int]:
    """Skip the comments before the header; return column → index and the header's line."""
    for number, text in enumerate(lines, 1):
        stripped = text.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            match = _VERSION_RE.match(stripped)
            if match and int(match.group(1)) > FORMAT_VERSION:
                raise MalformedTraceError(
                    f"{name}: trace format version {match.group(1)}; this tensorarena reads up "
                    f"to version {FORMAT_VERSION} (upgrade it)", line=number)
            continue
        cells = [cell.strip().lower().lstrip("\ufeff") for cell in next(csv.reader([text]))]
        for cell in cells:
            if cell not in COLUMNS:
                raise MalformedTraceError(
                    f"{name}: unknown column {cell!r}; a trace has {','.join(_REQUIRED)} and "
                    f"optionally {','.join(COLUMNS[3:])}", line=number, column=cell)
        for required in _REQUIRED:
            if required not in cells:
                raise MalformedTraceError(
                    f"{name}: missing column {required!r}; the header is {stripped!r} (the "
                    f"minimal header is {','.join(_REQUIRED)})", line=number, column=required)
        if len(set(cells)) != len(cells):
            raise MalformedTraceError(f"{name}: a column appears twice in {stripped!r}",
                                      line=number)
        return {cell: index for index, cell in enumerate(cells)}, number
    raise MalformedTraceError(f"{name}: empty file, expected the header op,id,size", line=1)


def read_partial(source: Source) -> str:
    """Why the trace in ``source`` ended early (its ``# partial: ...`` comment), or ``""``."""
    with open_lines(source) as lines:
        for text in lines:
            stripped = text.strip()
            if stripped and not stripped.startswith("#"):
                break  # the header: comments after it are not the file's
            if stripped.startswith(_PARTIAL):
                return stripped[len(_PARTIAL):].strip()
    return ""


def iter_csv(source: Source, *, live: LiveSet | None = None) -> Iterator[Event]:
    """Stream the checked events of a trace in our CSV format.

    ``live`` (optional) is the :class:`LiveSet` the events are checked against; pass your own to
    read the summary (peak live bytes...) once the stream is exhausted.
    """
    live = LiveSet() if live is None else live
    name = source_name(source)
    with open_lines(source) as lines:
        columns, offset = _header(lines, name)
        width = len(columns)
        i_op, i_id, i_size = columns["op"], columns["id"], columns["size"]
        i_stream = columns.get("stream")
        i_time = columns.get("time_us")
        i_tag = columns.get("tag")
        i_allocator = columns.get("allocator")
        i_site = columns.get("site")
        numeric = [columns[c] for c in _NUMBERS if c in columns]
        interned: dict[str, str] = {}  # one string per distinct site or allocator
        reader = csv.reader(lines)
        check = live.check
        while True:
            try:
                row = next(reader, None)
            except csv.Error as exc:
                raise MalformedTraceError(f"{name}: {exc}", line=offset + reader.line_num) from None
            if row is None:
                return
            line = offset + reader.line_num
            if len(row) != width or row[0][:1] == "#":
                if not row or row[0][:1] == "#" or (len(row) == 1 and not row[0].strip()):
                    continue
                raise MalformedTraceError(
                    f"{name}: {len(row)} fields, the header has {width}", line=line)
            op = row[i_op]
            if op != ALLOC and op != FREE:
                op = op.strip()
                if op != ALLOC and op != FREE:
                    raise MalformedTraceError(
                        f"op {op!r:.20} is neither 'a' (allocate) nor 'f' (free)", line=line,
                        column="op")
            try:  # the common case first; _cells says what is wrong with the others
                ident = int(row[i_id])
                nbytes = int(row[i_size]) if op == ALLOC or row[i_size] else 0
                stream = int(row[i_stream]) if i_stream is not None and row[i_stream] else 0
                time_us = int(row[i_time]) if i_time is not None and row[i_time] else None
                digits = "".join([row[i] for i in numeric])
                if "_" in digits or not digits.isascii():  # int() took more than digits
                    raise ValueError(digits)
            except ValueError:
                ident, nbytes, stream, time_us = _cells(row, op, line, i_id, i_size, i_stream,
                                                        i_time)
            if ident < 0:
                raise MalformedTraceError(f"id {ident} is negative", line=line, column="id")
            tag = row[i_tag] if i_tag is not None else ""
            allocator = row[i_allocator] if i_allocator is not None else ""
            site = row[i_site] if i_site is not None else ""
            if allocator or site:
                allocator = interned.setdefault(allocator, allocator)
                site = interned.setdefault(site, site)
            yield check(Event(op, ident, nbytes, stream, time_us, tag, allocator, site), line)


def _cells(row: list[str], op: str, line: int, i_id: int, i_size: int, i_stream: int | None,
           i_time: int | None) -> tuple[int, int, int, int | None]:
    """The numbers of a row that ``int()`` refused (or took, but are not ASCII digits), each
    checked with its column's name."""
    ident = _number(row[i_id], line, "id")
    text = row[i_size]
    nbytes = _number(text, line, "size") if op == ALLOC or text.strip() else 0
    stream = 0
    if i_stream is not None and row[i_stream].strip():
        stream = _number(row[i_stream], line, "stream")
    time_us = None
    if i_time is not None and row[i_time].strip():
        time_us = _number(row[i_time], line, "time_us")
    return ident, nbytes, stream, time_us


def _number(text: str, line: int, column: str) -> int:
    if not INTEGER_TEXT.match(text):
        raise MalformedTraceError(f"{column} {text.strip()!r:.40} is not an integer (ASCII "
                                  "digits)", line=line, column=column)
    return int_cell(text, line=line, column=column)


def _row(event: Event) -> tuple[object, ...]:
    op, ident, nbytes, stream, time_us, tag, allocator, site = event
    return (op, ident, nbytes, stream, "" if time_us is None else time_us, tag, allocator,
            site)


def write_csv(events: Iterable[Event], path: str | os.PathLike[str], *,
              columns: Iterable[str] | None = None, partial: str = "") -> None:
    """Write ``events`` to ``path`` atomically, in our CSV format.

    ``columns`` defaults to the minimal ``op,id,size`` plus each optional column that some
    event uses (which needs a second pass over ``events``: give a sequence, or name the columns
    to stream an iterator). ``partial`` (why the recording ended early) is written as a
    ``# partial: ...`` comment, which :func:`read_partial` gives back.
    """
    events = check_events(events)
    if columns is None:
        events = list(events)
        used = {"stream": any(e.stream for e in events),
                "time_us": any(e.time_us is not None for e in events),
                "tag": any(e.tag for e in events),
                "allocator": any(e.allocator for e in events),
                "site": any(e.site for e in events)}
        chosen = [c for c in COLUMNS if c in _REQUIRED or used[c]]
    else:
        chosen = list(columns)
        unknown = [c for c in chosen if c not in COLUMNS]
        if unknown or any(c not in chosen for c in _REQUIRED):
            raise MalformedTraceError(f"columns must include {_REQUIRED} and come from {COLUMNS}"
                                      f", got {chosen}")
    indices = [COLUMNS.index(c) for c in chosen]
    with atomic_text(path) as handle:
        handle.write(_version_line(chosen))
        if partial:
            handle.write(f"{_PARTIAL}{' '.join(partial.split())}\n")
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(chosen)
        if len(indices) == len(COLUMNS):
            writer.writerows(_row(e) for e in events)
        else:
            writer.writerows([_row(e)[i] for i in indices] for e in events)


class CsvWriter:
    """Writes events one at a time to a temporary file that becomes ``path`` on :meth:`close`
    (or on leaving ``with``), with every column. If the ``with`` block raises, or
    :meth:`abort` is called, the temporary file is removed and ``path`` is not touched.

    It is a callable sink: ``Logging(pool, sink=...)`` (via
    :func:`tensorarena.trace.TraceRecorder`) or any recorder may call it per event.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._stack = ExitStack()
        self._handle: IO[str] = self._stack.enter_context(atomic_text(path))
        self._handle.write(_version_line(COLUMNS))
        self._writer = csv.writer(self._handle, lineterminator="\n")
        self._writer.writerow(COLUMNS)
        self.path = path
        self.events = 0

    def __call__(self, event: Event) -> None:
        """Write one event."""
        self._writer.writerow(_row(event))
        self.events += 1

    write = __call__

    def close(self) -> None:
        """Finish the file and give it its final name."""
        self._stack.close()

    def abort(self) -> None:
        """Drop the file: nothing appears under the final name."""
        self._stack.__exit__(MalformedTraceError, MalformedTraceError("aborted"), None)

    def __enter__(self) -> CsvWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.__exit__(exc_type, exc, tb)
