"""``memory_summary()``: an allocator's statistics as a text table, like PyTorch's.

It reads statistics by field name, so it works for anything that exposes them: a
:class:`~tensorarena.memory.pool.Pool`, an adaptor such as
:class:`~tensorarena.adaptors.Statistics`, a core :class:`~tensorarena.core.Arena`, or a frozen
statistics record itself. Each row of the table is one quantity in PyTorch's vocabulary, with the
columns *current*, *peak*, *total allocated* and *total freed*; a cell whose field the record does
not have shows ``-``, a row with no field at all is left out, and numeric fields that no row
claims are listed under the table, so nothing a record reports is hidden.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from tensorarena.sizes import format_size

__all__ = ["memory_summary"]

_Cell = tuple[str, ...]  # field names to try, in order (aliases for records of other layers)

#: (label, is_bytes, current, peak, total allocated, total freed)
_ROWS: tuple[tuple[str, bool, _Cell, _Cell, _Cell, _Cell], ...] = (
    ("Allocated memory", True, ("allocated_bytes", "allocated"),
     ("peak_allocated_bytes", "peak_allocated"), ("total_allocated_bytes",),
     ("total_freed_bytes",)),
    # An arena's or an upstream's ``reserved`` (its live blocks' rounded bytes) is what a pool
    # calls *active*.
    ("Active memory", True, ("active_bytes", "reserved"), ("peak_active_bytes", "peak_reserved"),
     (), ()),
    ("Reserved memory", True, ("reserved_bytes",), ("peak_reserved_bytes",),
     ("total_reserved_bytes",), ("total_released_bytes",)),
    ("Free memory", True, ("free_bytes", "free"), (), (), ()),
    ("Largest free extent", True, ("largest_free",), (), (), ()),
    ("Cached memory", True, ("cached_bytes",), ("peak_cached_bytes",), (), ()),
    ("Capacity", True, ("capacity",), (), (), ()),
    ("Limit", True, ("maximum_size", "limit"), (), (), ()),
    ("Allocations", False, ("allocation_count", "live_blocks"), ("peak_allocation_count",),
     ("total_allocations", "alloc_count"), ("total_deallocations", "free_count")),
    ("Arenas", False, ("arena_count",), ("peak_arena_count",), (), ()),
    ("Upstream calls", False, (), (), ("upstream_allocations",), ("upstream_deallocations",)),
    ("Free extents", False, ("free_extents",), (), (), ()),
    ("Cached blocks", False, ("cached_blocks",), (), (), ()),
)

_HEADERS = ("Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")


def _statistics_of(source: object) -> Any:
    """The statistics record of ``source``: its ``statistics()`` result, or ``source`` itself."""
    method = getattr(source, "statistics", None)
    return method() if callable(method) else source


def _fields(record: object) -> dict[str, object]:
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    else:
        values = {k: v for k, v in vars(record).items() if not k.startswith("_")}
    # Derived properties (fragmentation) are read as attributes, not dataclass fields.
    for name in ("fragmentation", "hit_rate"):
        value = getattr(record, name, None)
        if isinstance(value, float):
            values[name] = value
    return values


def _cell(values: dict[str, object], names: _Cell, is_bytes: bool) -> tuple[bool, str]:
    for name in names:
        if name in values:
            value = values[name]
            if value is None:
                return True, "none"
            if isinstance(value, int) and not isinstance(value, bool):
                return True, format_size(value) if is_bytes else str(value)
            return True, str(value)
    return False, "-"


def memory_summary(source: object, *, title: str | None = None) -> str:
    """Render the statistics of ``source`` (an allocator or a statistics record) as a text table.

    ``title`` defaults to the ``repr`` of ``source`` when it is not a bare record.
    """
    record = _statistics_of(source)
    if record is None or not (dataclasses.is_dataclass(record) or hasattr(record, "__dict__")):
        raise TypeError(
            f"memory_summary needs an object with statistics() or a statistics record, "
            f"not {type(source).__name__}"
        )
    values = _fields(record)
    used: set[str] = set()
    rows: list[tuple[str, ...]] = []
    for label, is_bytes, *cells in _ROWS:
        rendered = [_cell(values, names, is_bytes) for names in cells]
        if any(found for found, _ in rendered):
            rows.append((label, *(text for _, text in rendered)))
            for names in cells:
                used.update(n for n in names if n in values)
    extras = [
        (name, value)
        for name, value in values.items()
        if name not in used and isinstance(value, int | float) and not isinstance(value, bool)
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(_HEADERS)]
    inner = sum(widths) + 3 * (len(widths) - 1) + 2
    if title is None:
        title = type(record).__name__ if record is source else repr(source)
    title_lines = textwrap.wrap(title, inner - 2) or [""]
    rule, thin = "|" + "=" * inner + "|", "|" + "-" * inner + "|"

    def line(cells: tuple[str, ...]) -> str:
        tail = zip(cells[1:], widths[1:], strict=True)
        parts = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in tail]
        return "| " + " | ".join(parts) + " |"

    out = [rule, *("| " + t.center(inner - 2) + " |" for t in title_lines), rule]
    out += [line(_HEADERS), thin, *(line(r) for r in rows), rule]
    for name, value in extras:
        text = f"{value:.1%}" if name in ("fragmentation", "hit_rate") else (
            f"{value:.4g}" if isinstance(value, float) else str(value)
        )
        out.append("| " + f"{name.replace('_', ' ').capitalize()}: {text}".ljust(inner - 2) + " |")
    if extras:
        out.append(rule)
    return "\n".join(out)
