"""Every trace format behind three calls, the format told by the file's content.

:func:`detect_format` reads the start of a file: a pickle (first byte ``0x80``) is a PyTorch
memory snapshot; a text whose first line that is not a comment is RMM's header
(``Thread,Time,Action,Pointer,Size,Stream``) is an RMM log; a header with ``op``, ``id`` and
``size`` is our CSV. The name of the file plays no part (a ``.csv`` may be either CSV).

:func:`iter_events` streams the checked events of a CSV file (ours or RMM's) without holding
them, for replays of traces longer than memory; a snapshot pickle is loaded whole (pickles
cannot be streamed) and then iterated. :func:`read_trace` returns a :class:`Trace`;
:func:`write_trace` writes one in any format, atomically.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from tensorarena.errors import InvalidArgumentError
from tensorarena.trace._text import Source, check_source, is_path, open_lines, source_name
from tensorarena.trace.csv_format import iter_csv, read_partial, write_csv
from tensorarena.trace.model import Event, LiveSet, MalformedTraceError, Trace
from tensorarena.trace.rmm_format import RmmReadStats, iter_rmm, write_rmm
from tensorarena.trace.snapshot import read_snapshot, write_snapshot

__all__ = ["FORMATS", "Format", "detect_format", "iter_events", "read_all", "read_trace",
           "write_trace"]

Format = Literal["csv", "rmm", "pytorch_snapshot"]
#: Every format, by the name the functions and the command line take.
FORMATS: tuple[Format, ...] = ("csv", "rmm", "pytorch_snapshot")
_PICKLE_MAGIC = b"\x80"


def _check_format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"unknown trace format {fmt!r}; expected one of "
                                   f"{', '.join(FORMATS)}")
    return fmt


def detect_format(source: Source) -> Format:
    """The format of ``source`` (a path, a text, or a stream that can seek), by its content."""
    check_source(source)
    stream = None if is_path(source) or isinstance(source, str) else source
    if stream is None:
        head = b""
        if is_path(source):
            try:
                with Path(source).open("rb") as handle:  # type: ignore[arg-type]
                    head = handle.read(1)
            except OSError as exc:
                raise MalformedTraceError(f"cannot read {str(source)!r}: "
                                          f"{exc.strerror or exc}") from exc
    else:
        position = stream.tell()  # type: ignore[union-attr]
        head = stream.read(1)  # type: ignore[union-attr,assignment]
        stream.seek(position)  # type: ignore[union-attr]
    if head == _PICKLE_MAGIC:
        return "pytorch_snapshot"
    try:
        return _text_format(source)
    finally:
        if stream is not None:
            stream.seek(position)  # type: ignore[union-attr]


def _text_format(source: Source) -> Format:
    with open_lines(source) as lines:
        for number, text in enumerate(lines, 1):
            stripped = text.strip()
            if not stripped or stripped.startswith("#"):
                continue
            cells = {c.strip().lower().lstrip("\ufeff") for c in next(csv.reader([stripped]))}
            if {"thread", "time", "action", "pointer", "size"} <= cells:
                return "rmm"
            if {"op", "id", "size"} <= cells:
                return "csv"
            raise MalformedTraceError(
                f"{source_name(source)}: unknown trace format: the header {stripped!r:.80} "
                "is neither ours (op,id,size[,stream,time_us,tag]) nor RMM's "
                "(Thread,Time,Action,Pointer,Size,Stream), and the file is not a pickle",
                line=number)
    raise MalformedTraceError(f"{source_name(source)}: empty file", line=1)


def iter_events(source: Source, *, format: Format | None = None,
                live: LiveSet | None = None) -> Iterator[Event]:
    """Stream the checked events of ``source`` (CSV formats stream; a snapshot loads whole).

    ``live``: a :class:`LiveSet` to check against (read its summary after the stream ends).
    """
    fmt = detect_format(source) if format is None else _check_format(format)
    if fmt == "csv":
        return iter_csv(source, live=live)
    if fmt == "rmm":
        return iter_rmm(source, live=live)
    trace = read_snapshot(source)  # type: ignore[arg-type]
    if live is None:
        return iter(trace.events)
    return (live.check(event, number) for number, event in enumerate(trace.events, 1))


def read_trace(source: Source, *, format: Format | None = None, name: str | None = None
               ) -> Trace:
    """Read a whole trace in any format (detected from its content unless ``format`` says)."""
    fmt = detect_format(source) if format is None else _check_format(format)
    if name is None:
        name = Path(source).stem if is_path(source) else "trace"  # type: ignore[arg-type]
    if fmt == "pytorch_snapshot":
        return read_snapshot(source, name=name)  # type: ignore[arg-type]
    metadata: dict[str, str] = {"format": fmt}
    if fmt == "rmm":
        stats = RmmReadStats()
        events = list(iter_rmm(source, stats=stats))
        metadata["allocate_failures"] = str(stats.failures)
    else:
        events = list(iter_csv(source))
        partial = read_partial(source) if is_path(source) else ""
        if partial:
            metadata["partial"] = partial
    return Trace.from_events(events, name=name, metadata=metadata)


def read_all(source: Trace | Source | Iterable[Event]) -> Trace:
    """``source`` as a :class:`Trace`: a Trace as it is, a file, text or stream read whole, events
    in memory checked."""
    if isinstance(source, Trace):
        return source
    if isinstance(source, str) or hasattr(source, "__fspath__") or hasattr(source, "read"):
        return read_trace(source)  # type: ignore[arg-type]
    return Trace.from_events(source)


def write_trace(trace: Iterable[Event], path: str | os.PathLike[str], *,
                format: Format = "csv") -> None:
    """Write checked events (a :class:`Trace`) to ``path`` in ``format``, atomically."""
    fmt = _check_format(format)
    if fmt == "csv":
        partial = trace.metadata.get("partial", "") if isinstance(trace, Trace) else ""
        write_csv(trace, path, partial=partial)
    elif fmt == "rmm":
        write_rmm(trace, path)
    else:
        write_snapshot(trace, path)
