"""Reading text traces line by line, with the line number of every fault.

The CSV readers (ours and RMM's) stream: a trace of a million lines is never held in memory, so a
replay uses memory in proportion to what is live, not to the file. A bad byte is reported on its
own line (a text stream decodes a whole block ahead and fails where the block starts, so the line
is found by reading again, one line at a time). A source is a path, a text
with at least one line break (handy in tests and notebooks), or an open file.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from tensorarena.trace.model import MalformedTraceError

__all__ = ["Source", "int_cell", "is_path", "open_lines", "source_name"]

Source = str | os.PathLike[str] | IO[str] | IO[bytes]
"""A path, a text holding the whole trace (any string with a line break), or an open file."""

# More digits than any byte count, id or address has (2**64 has 20); far below Python's limit on
# converting long digit strings, so a hostile cell costs nothing.
_MAX_DIGITS = 40


def is_path(source: object) -> bool:
    """True when ``source`` names a file rather than holding the trace's text or a stream."""
    return isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source)


def check_source(source: object) -> None:
    """Raise :class:`MalformedTraceError` unless ``source`` is a path, a text or a stream."""
    if not (isinstance(source, (str, os.PathLike)) or hasattr(source, "read")):
        raise MalformedTraceError(
            f"expected a trace as a path, a text or a readable stream, got "
            f"{type(source).__name__}"
        )


def source_name(source: object) -> str:
    """A short name for messages: the file name, or ``<text>``/``<stream>``."""
    if is_path(source):
        return str(source)
    return "<text>" if isinstance(source, str) else "<stream>"


def _decoded(raw_lines: Iterator[bytes]) -> Iterator[str]:
    for number, raw in enumerate(raw_lines, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedTraceError(f"not UTF-8 text ({exc.reason} at byte {exc.start})",
                                      line=number) from None


def _bad_line(path: Path) -> MalformedTraceError:
    """The error for the first line of ``path`` that is not UTF-8 (found by reading again)."""
    with path.open("rb") as handle:
        try:
            for _ in _decoded(iter(handle)):
                pass
        except MalformedTraceError as error:
            return error
    return MalformedTraceError(f"{path}: not UTF-8 text")  # pragma: no cover - it decoded


@contextlib.contextmanager
def open_lines(source: Source) -> Iterator[Iterator[str]]:
    """The lines of ``source``, decoded; a file opened here is closed after.

    A file is read as UTF-8 text by the C decoder (the fast path: most of a replay's reading
    time is here); if it holds a bad byte, the error names the line, found by reading the file
    again one line at a time.
    """
    if is_path(source):
        path = Path(source)  # type: ignore[arg-type]
        try:
            handle = path.open("r", encoding="utf-8", newline="")
        except OSError as exc:
            raise MalformedTraceError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
        with handle:
            try:
                yield handle
            except UnicodeDecodeError:
                raise _bad_line(path) from None
        return
    if isinstance(source, str):
        yield iter(io.StringIO(source, newline=""))
        return
    if isinstance(source, io.TextIOBase):
        yield iter(source)
        return
    check_source(source)
    yield _decoded(iter(source))  # type: ignore[arg-type]


def int_cell(text: str, *, line: int, column: str, base: int = 10) -> int:
    """``text`` as an int (``base`` 16 also takes a ``0x`` prefix), else a located error."""
    stripped = text.strip()
    digits = stripped[2:] if base == 16 and stripped[:2].lower() == "0x" else stripped
    if len(digits) > _MAX_DIGITS:
        raise MalformedTraceError(f"{column} has {len(digits)} digits: far too large",
                                  line=line, column=column)
    try:
        return int(digits, base)
    except ValueError:
        kind = "a hexadecimal integer" if base == 16 else "an integer"
        raise MalformedTraceError(f"{column} {stripped!r:.40} is not {kind}", line=line,
                                  column=column) from None
