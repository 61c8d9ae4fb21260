"""``memory_summary()``, ``memory_stats()``, ``reset_peak_stats()``: PyTorch's three calls.

Each takes a resource (default: the default resource of ``tensorarena.empty``) and descends
through its adaptors (``.upstream``) to the layer that holds memory, as a user of
``torch.cuda.memory_summary()`` expects: the table shows the first
:class:`~tensorarena.stats.MemoryStatistics` of the stack (a pool's, say), and one line for each
adaptor above it that keeps statistics of its own (a thread cache's hits, a limit).

The table is driven by the record's fields, in the vocabulary of :mod:`tensorarena.stats`: every
:class:`~tensorarena.stats.Count` is a row (current, peak, total, freed), every other number a
line under the table. No alias table: the same word means the same thing in every layer.
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Iterator

from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.resource import check_resource
from tensorarena.memory.resource import resource_stack as layers_of
from tensorarena.sizes import format_size
from tensorarena.stats import Count, MemoryStatistics, flatten

__all__ = ["memory_stats", "memory_summary", "reset_peak_stats", "resource_stack"]

_HEADERS = ("Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")


def _default() -> object:
    from tensorarena.interop.default import default_resource

    return default_resource()


def resource_stack(source: object) -> Iterator[object]:
    """``source``, its upstream, the upstream's upstream, ... (adaptors and pools expose
    ``.upstream``); stops at the first object without one. A class (``Pool`` for ``pool``)
    is an :class:`~tensorarena.errors.InvalidResourceError`: its methods need an instance."""
    if isinstance(source, type):
        check_resource(source, name="source")
    yield from layers_of(source)


def _records(source: object) -> list[tuple[object, object]]:
    """``(owner, record)`` for every layer of the stack that keeps statistics."""
    if dataclasses.is_dataclass(source) and not isinstance(source, type):
        return [(None, source)]  # a bare record
    records = []
    for layer in resource_stack(source):
        method = getattr(layer, "statistics", None)
        if callable(method):
            records.append((layer, method()))
    return records


def _prefix(owner: object) -> str:
    name = type(owner).__name__
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
    return snake + "."


def memory_stats(source: object = None) -> dict[str, int | float | None]:
    """Statistics as ``torch.cuda.memory_stats()``'s flat dictionary.

    The memory-holding layer's keys are PyTorch's (``"allocated_bytes.all.current"``,
    ``"reserved_bytes.all.peak"``, ``"num_ooms"``, ``"num_alloc_retries"``, ...); an adaptor's
    own keys carry its name as a prefix (``"thread_cached.hits"``). ``source``: a resource
    (default: the default resource) or a statistics record.
    """
    records = _records(_default() if source is None else source)
    if not records:
        raise InvalidArgumentError(f"{type(source).__name__} keeps no statistics")
    flat: dict[str, int | float | None] = {}
    main = _main_index(records)
    for i, (owner, record) in enumerate(records):
        flat.update(flatten(record, prefix="" if i == main else _prefix(owner)))
    return flat


def reset_peak_stats(source: object = None) -> None:
    """Set every peak of every layer of the stack to its current value."""
    for layer in resource_stack(_default() if source is None else source):
        method = getattr(layer, "reset_peak_stats", None)
        if callable(method):
            method()


def _main_index(records: list[tuple[object, object]]) -> int:
    for i, (_, record) in enumerate(records):
        if isinstance(record, MemoryStatistics):
            return i
    return 0


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def _number(name: str, value: int | float) -> str:
    if isinstance(value, float):
        return f"{value:.1%}" if name in ("fragmentation", "hit_rate") else f"{value:.4g}"
    return format_size(value) if name.endswith("_bytes") or name == "limit" else str(value)


def _rows(record: object) -> tuple[list[tuple[str, ...]], list[tuple[str, str]]]:
    """Table rows (one per Count) and the other numbers of ``record`` as (label, text)."""
    rows: list[tuple[str, ...]] = []
    lines: list[tuple[str, str]] = []
    for field in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, field.name)
        if isinstance(value, Count):
            cells = (value.current, value.peak, value.total, value.freed)
            rows.append((_label(field.name), *(_number(field.name, c) for c in cells)))
        elif value is None:
            lines.append((_label(field.name), "none"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            lines.append((_label(field.name), _number(field.name, value)))
    for name in ("fragmentation", "hit_rate"):  # derived properties
        value = getattr(record, name, None)
        if isinstance(value, float):
            lines.append((_label(name), _number(name, value)))
    return rows, lines


def _tightest_limit(records: list[tuple[object, object]], main: int,
                    lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The main block's ``Limit`` line says the tightest limit of the whole stack (what a
    request actually meets), and whose it is where another layer's is tighter."""
    limits = [(limit, owner) for owner, record in records
              if isinstance(limit := getattr(record, "limit", None), int)
              and not isinstance(limit, bool)]
    if not limits:
        return lines
    tightest, owner = min(limits, key=lambda pair: pair[0])
    own = getattr(records[main][1], "limit", None)
    if own == tightest:
        return lines
    text = f"{format_size(tightest)} (the tightest, {type(owner).__name__}'s; " + (
        "none here)" if own is None else f"{format_size(own)} here)")
    if all(label != "Limit" for label, _ in lines):
        return [*lines, ("Limit", text)]
    return [(label, text if label == "Limit" else value) for label, value in lines]


def memory_summary(source: object = None, *, title: str | None = None) -> str:
    """The statistics of ``source`` (default: the default resource) as a text table.

    ``source`` is a resource or adaptor stack (descended to the layer that holds memory) or a
    statistics record. ``title`` defaults to the ``repr`` of ``source``.
    """
    source = _default() if source is None else source
    records = _records(source)
    if not records:
        raise InvalidArgumentError(
            f"memory_summary needs a resource that keeps statistics (or a statistics record), "
            f"not {type(source).__name__}"
        )
    main = _main_index(records)
    rows, lines = _rows(records[main][1])
    lines = _tightest_limit(records, main, lines)
    for i, (owner, record) in enumerate(records):
        if i != main:
            _, extra = _rows(record)
            shown = ", ".join(f"{label.lower()} {text}" for label, text in extra)
            lines.append((type(owner).__name__, shown or "-"))
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
        for i, h in enumerate(_HEADERS)
    ]
    inner = sum(widths) + 3 * (len(widths) - 1) + 2
    if title is None:
        title = type(source).__name__ if records[0][0] is None else repr(source)
    rule, thin = "|" + "=" * inner + "|", "|" + "-" * inner + "|"

    def line(cells: tuple[str, ...]) -> str:
        tail = zip(cells[1:], widths[1:], strict=True)
        parts = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in tail]
        return "| " + " | ".join(parts) + " |"

    out = [rule, *("| " + t.center(inner - 2) + " |" for t in textwrap.wrap(title, inner - 2))]
    out += [rule, line(_HEADERS), thin, *(line(r) for r in rows), rule]
    for label, text in lines:
        for piece in textwrap.wrap(f"{label}: {text}", inner - 2) or [""]:
            out.append("| " + piece.ljust(inner - 2) + " |")
    if lines:
        out.append(rule)
    return "\n".join(out)
