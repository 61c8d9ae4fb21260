"""Read and write planning problems and solutions in the public minimalloc CSV format.

The format (google/minimalloc): a header row, then one buffer per row; columns are matched by
name, in any order. The minimum is ``id,lower,upper,size`` with the lifetime half-open
``[lower, upper)``. Also understood:

- ``alignment``: the buffer's offset must be a multiple of it (a power of two);
- ``offset``: a solution's placement (read by :func:`read_solution`, ignored by
  :func:`read_problem`: we treat it as an answer, not as a pinned buffer);
- ``fixed_offset``: a pinned buffer's offset (``Buffer.offset``; empty: free). Not ``offset``,
  which already means a solution's placement here and in every file we have written;
- legacy headers ``start``/``begin`` for ``lower`` and ``buffer``/``buffer_id`` for ``id``;
  an ``end`` column is an *inclusive* upper bound, so the parser adds 1;
- ``hint`` (a preferred offset) is accepted and ignored; a non-empty ``gaps`` cell is refused
  rather than silently widened into a full lifetime.

Every fault raises :class:`~tensorarena.errors.InvalidProblemError` with the 1-based line and
the column name, and nothing is returned: a half-read problem never escapes. Files are decoded
as UTF-8 one line at a time, so that a bad byte is reported on its own line (a text stream would
decode a whole block ahead and fail on the line where the block starts).
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning.options import check_capacity, check_problem
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.sizes import INTEGER_TEXT, Size

__all__ = [
    "capacity_from_name",
    "read_problem",
    "read_solution",
    "write_problem",
    "write_solution",
]

Source = str | os.PathLike[str] | TextIO
"""A path, a CSV text (any string with a line break), or an open text stream."""

_INT = INTEGER_TEXT  # ASCII digits: "١٢" is not 12
# More digits than any plannable number has (the planners stop at 2**62, 19 digits); also far
# below Python's limit on converting long digit strings.
_MAX_DIGITS = 30
_LONE_CR = re.compile(r"(?<=\r)(?!\n)(?=.)", re.DOTALL)

# canonical name → accepted header names (first match wins)
_ALIASES: dict[str, tuple[str, ...]] = {
    "id": ("id", "buffer", "buffer_id"),
    "lower": ("lower", "start", "begin"),
    "upper": ("upper", "end"),
    "size": ("size",),
    "alignment": ("alignment",),
    "offset": ("offset",),
    "fixed_offset": ("fixed_offset",),
    "gaps": ("gaps",),
}


def _open(source: Source) -> tuple[Iterable[str], str, BinaryIO | TextIO | None]:
    """(lines, name for messages, the file we opened and must close, if any)."""
    if isinstance(source, str) and ("\n" in source or "\r" in source):
        return io.StringIO(source), "<text>", None
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        try:
            binary = path.open("rb")
        except OSError as exc:
            raise InvalidProblemError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
        return _decoded(binary, str(path)), str(path), binary
    if not callable(getattr(source, "read", None)) or isinstance(source, bytes | bytearray):
        raise InvalidArgumentError(
            "a problem source must be a path, CSV text or an open text stream, got "
            f"{type(source).__name__} {source!r:.60}"
        )
    return source, getattr(source, "name", "<stream>"), None


def _decoded(binary: BinaryIO, name: str) -> Iterator[str]:
    """The lines of a file, each decoded as UTF-8 on its own; a bad byte names its line.

    Lines end at ``\n``, ``\r\n`` or a lone ``\r``, as in a file opened with ``newline=""``.
    """
    for number, raw in enumerate(binary, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidProblemError(
                f"{name}: not UTF-8 text: byte {raw[exc.start]:#04x} at column {exc.start + 1} "
                "does not decode",
                line=number,
            ) from None
        if "\r" in text:
            yield from _LONE_CR.split(text)
        else:
            yield text


def _rows(lines: Iterable[str], name: str) -> Iterator[tuple[dict[str, tuple[str, str]], int]]:
    """Yield ({canonical: (header, cell)}, line) for every non-blank data row.

    The header is checked before the first row, so a missing column fails first.
    """
    reader = csv.reader(lines)
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise InvalidProblemError(f"{name}: not a CSV file: {exc}", line=1) from exc
    if header is None or not any(cell.strip() for cell in header):
        raise InvalidProblemError(f"{name}: empty file, expected a header", line=1)
    names = [cell.strip().lower() for cell in header]
    if names and names[0].startswith("\ufeff"):
        names[0] = names[0][1:]
    where: dict[str, tuple[str, int]] = {}
    for canonical, aliases in _ALIASES.items():
        for alias in aliases:
            if alias in names:
                where[canonical] = (alias, names.index(alias))
                break
    for required in ("id", "lower", "upper", "size"):
        if required not in where:
            accepted = "/".join(_ALIASES[required])
            raise InvalidProblemError(
                f"{name}: missing column {required!r} (accepted headers: {accepted}); "
                f"header is {','.join(header)!r}",
                line=1,
                column=required,
            )
    while True:
        try:
            row = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InvalidProblemError(f"{name}: {exc}", line=reader.line_num) from exc
        if row is None:
            return
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise InvalidProblemError(
                f"{name}: {len(row)} fields, the header has {len(names)}",
                line=reader.line_num,
            )
        cells = {c: (alias, row[i]) for c, (alias, i) in where.items()}
        yield cells, reader.line_num


def _int(cells: dict[str, tuple[str, str]], column: str, line: int) -> int:
    header, text = cells[column]
    if not _INT.match(text):
        raise InvalidProblemError(f"{header} {text.strip()!r:.40} is not an integer", line=line,
                                  column=header)
    if len(text.strip().lstrip("+-")) > _MAX_DIGITS:
        raise InvalidProblemError(f"{header} has {len(text.strip())} digits: far too large",
                                  line=line, column=header)
    return int(text)


def _parse(source: Source) -> tuple[str, list[Buffer], list[int | None]]:
    buffers: list[Buffer] = []
    offsets: list[int | None] = []
    seen: set[str] = set()
    lines, name, opened = _open(source)
    try:
        _collect(_rows(lines, name), buffers, offsets, seen)
    finally:
        if opened is not None:
            opened.close()
    return name, buffers, offsets


def _collect(
    rows: Iterator[tuple[dict[str, tuple[str, str]], int]],
    buffers: list[Buffer],
    offsets: list[int | None],
    seen: set[str],
) -> None:
    for cells, line in rows:
        id_header, buffer_id = cells["id"]
        buffer_id = buffer_id.strip()
        if not buffer_id:
            raise InvalidProblemError("empty buffer id", line=line, column=id_header)
        if buffer_id in seen:
            raise InvalidProblemError(f"duplicate buffer id {buffer_id!r}", line=line,
                                      column=id_header)
        seen.add(buffer_id)
        start = _int(cells, "lower", line)
        end = _int(cells, "upper", line)
        upper_header = cells["upper"][0]
        if upper_header == "end":
            end += 1  # legacy inclusive upper bound
        if end <= start:
            raise InvalidProblemError(
                f"buffer {buffer_id!r}: the lifetime [{start}, {end}) is empty "
                f"({upper_header} must be after {cells['lower'][0]})",
                line=line,
                column=upper_header,
            )
        size = _int(cells, "size", line)
        if size < 0:
            raise InvalidProblemError(f"buffer {buffer_id!r}: negative size {size}", line=line,
                                      column="size")
        alignment = 1
        if "alignment" in cells and cells["alignment"][1].strip():
            alignment = _int(cells, "alignment", line)
            if alignment <= 0 or alignment & (alignment - 1):
                raise InvalidProblemError(
                    f"buffer {buffer_id!r}: alignment {alignment} is not a positive power of two",
                    line=line,
                    column="alignment",
                )
        if "gaps" in cells and cells["gaps"][1].strip():
            raise InvalidProblemError(
                f"buffer {buffer_id!r}: lifetime gaps are not supported", line=line,
                column="gaps",
            )
        offset: int | None = None
        if "offset" in cells and cells["offset"][1].strip():
            offset = _int(cells, "offset", line)
        pin: int | None = None
        if "fixed_offset" in cells and cells["fixed_offset"][1].strip():
            pin = _int(cells, "fixed_offset", line)
            if pin < 0 or pin % alignment:
                raise InvalidProblemError(
                    f"buffer {buffer_id!r}: pinned offset {pin} is "
                    + ("negative" if pin < 0 else f"not a multiple of its alignment {alignment}"),
                    line=line,
                    column="fixed_offset",
                )
        buffers.append(Buffer(buffer_id, start, end, size, alignment, pin))
        offsets.append(offset)


def _problem_name(source: Source, name: str) -> str:
    if isinstance(source, str | os.PathLike) and name not in ("<text>", "<stream>"):
        return Path(name).stem
    return ""


def read_problem(source: Source, *, capacity: Size | None = None) -> Problem:
    """Read a problem from a minimalloc CSV (a path, CSV text, or a text stream).

    ``capacity`` (bytes or a size string such as ``"1MiB"``) is attached to the problem; the
    file itself never carries one (minimalloc puts it in the file name, ``A.1048576.csv``: see
    :func:`capacity_from_name`).
    """
    capacity = check_capacity(capacity)
    name, buffers, _ = _parse(source)
    return Problem(buffers, capacity=capacity, name=_problem_name(source, name))


def read_solution(source: Source, problem: Problem | None = None) -> Plan:
    """Read a solution CSV (a problem CSV with an ``offset`` column) as a :class:`Plan`.

    With ``problem``, the rows are matched to its buffers by id (any row order) and must name
    exactly its buffers with the same lifetimes and sizes; without, the problem is read from
    the file itself. The plan is not validated here: call
    :func:`~tensorarena.planning.validate` on it.
    """
    if problem is not None:
        check_problem(problem)
    name, buffers, offsets = _parse(source)
    for buffer, offset in zip(buffers, offsets, strict=True):
        if offset is None:
            raise InvalidProblemError(f"{name}: buffer {buffer.id!r} has no offset",
                                      column="offset")
    given = {b.id: (b, o) for b, o in zip(buffers, offsets, strict=True)}
    if problem is None:
        problem = Problem(buffers, name=_problem_name(source, name))
    missing = [b.id for b in problem.buffers if b.id not in given]
    extra = sorted(set(given) - {b.id for b in problem.buffers})
    if missing or extra:
        raise InvalidProblemError(
            f"{name}: the solution does not match the problem: "
            f"missing ids {missing[:5]}, unknown ids {extra[:5]}",
            column="id",
        )
    result: list[int] = []
    for buffer in problem.buffers:
        row, offset = given[buffer.id]
        if (row.start, row.end, row.nbytes) != (buffer.start, buffer.end, buffer.nbytes):
            raise InvalidProblemError(
                f"{name}: buffer {buffer.id!r} differs from the problem's "
                f"([{row.start}, {row.end}) × {row.nbytes} vs "
                f"[{buffer.start}, {buffer.end}) × {buffer.nbytes})",
                column="id",
            )
        assert offset is not None
        result.append(offset)
    return Plan(problem, tuple(result), planner="file")


def capacity_from_name(path: str | os.PathLike[str]) -> int | None:
    """The capacity a minimalloc benchmark file name states (``A.1048576.csv`` → 1048576)."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgumentError(f"expected a path, got {type(path).__name__} {path!r:.60}")
    match = re.search(r"\.(\d+)\.csv$", os.fspath(path))
    return int(match.group(1)) if match else None


def _write(target: str | os.PathLike[str] | TextIO, problem: Problem,
           offsets: tuple[int, ...] | None) -> None:
    if not isinstance(target, str | os.PathLike) and not callable(getattr(target, "write", None)):
        raise InvalidArgumentError(
            f"a target must be a path or an open text stream, got {type(target).__name__}"
        )
    aligned = any(b.alignment != 1 for b in problem.buffers)
    pinned = any(b.offset is not None for b in problem.buffers)
    header = ["id", "lower", "upper", "size"] + (["alignment"] if aligned else [])
    header += ["fixed_offset"] if pinned else []
    if offsets is not None:
        header.append("offset")

    def emit(stream: TextIO) -> None:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(header)
        for i, b in enumerate(problem.buffers):
            row: list[object] = [b.id, b.start, b.end, b.nbytes]
            if aligned:
                row.append(b.alignment)
            if pinned:
                row.append("" if b.offset is None else b.offset)
            if offsets is not None:
                row.append(offsets[i])
            writer.writerow(row)

    if isinstance(target, str | os.PathLike):
        with Path(target).open("w", newline="", encoding="utf-8") as stream:
            emit(stream)
    else:
        emit(target)


def write_problem(problem: Problem, target: str | os.PathLike[str] | TextIO) -> None:
    """Write ``problem`` as minimalloc CSV (``alignment`` and ``fixed_offset`` columns only when
    some buffer has one).

    A file that cannot be written raises :class:`OSError`, as ``open`` does.
    """
    _write(target, check_problem(problem), None)


def write_solution(plan: Plan, target: str | os.PathLike[str] | TextIO) -> None:
    """Write ``plan`` as a minimalloc solution CSV: the problem's columns plus ``offset``.

    A file that cannot be written raises :class:`OSError`, as ``open`` does.
    """
    if not isinstance(plan, Plan):
        raise InvalidArgumentError(f"expected a Plan, got {type(plan).__name__}")
    _write(target, plan.problem, plan.offsets)
