"""``tensorarena replay TRACE``: replay an allocation trace on our strategies and the baselines.

A contract other tools rely on. With ``--json`` stdout holds exactly one JSON object::

    {"trace": {"name": str, "format": str, "events": int, "allocations": int, "frees": int,
               "peak_live": int, "peak_live_blocks": int, "total_bytes": int,
               "largest": int, "live_at_end": int},
     "results": {NAME: {"peak_reserved": int, "footprint_ratio": float, "fragmentation": float,
                        "ns_per_op": float, "failures": int, "end_reserved": int,
                        "end_footprint_ratio": float, "upstream_allocs": int, ...}, ...},
     "skipped": {NAME: "why"}}

``--recommend`` adds ``"recommendation"`` (the configuration to use, its code and numbers, and
the whole ranking; see :mod:`tensorarena.trace.recommend`). ``fragmentation`` and the upstream
counts are ``null`` for the system allocators, which report neither. Exit status: 0 after a
replay (failures are reported, not fatal); 2 for a malformed trace (with its line), an unreadable
file or a bad option, as one line on stderr.

``--strategy`` takes a strategy (``best_fit``...), a baseline (``pytorch_like``, ``glibc``,
``jemalloc``, ``mimalloc``), ``learned`` (plans learned from the trace's repeating steps, found
without markers; its result adds ``steady_footprint_ratio``: peak reserved during the steps
served from a plan over peak live, ``null`` when no step was), a comma-separated list, or ``all``
(every strategy and baseline; ``all,learned`` adds learned).
A baseline that cannot run here (a library not installed) is listed under ``skipped``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorarena.errors import TensorArenaError
from tensorarena.sizes import format_size

if TYPE_CHECKING:
    from tensorarena.trace.model import Trace, TraceSummary
    from tensorarena.trace.recommend import Recommendation
    from tensorarena.trace.replay import ReplayResult

__all__ = ["configure", "run"]

#: Above this size a trace file is streamed for every configuration instead of read once.
_STREAM_ABOVE = 4 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``replay`` command's arguments."""
    from tensorarena.trace.configs import BASELINES, DEFAULT_GROWTH, GROWTH_POLICIES

    parser.epilog = (
        "Formats (detected from the content): our CSV (op,id,size[,stream,time_us,tag]), RMM's "
        "logging CSV, PyTorch memory-snapshot pickles (read without running code). Our pools "
        "replay over VirtualMemory (bookkeeping: no page is touched); the system allocators "
        "run in a child process and touch every page of every allocation, so their time "
        "includes page faults. Exit status: 0 replayed; 2 malformed trace or bad option."
    )
    parser.add_argument("trace", metavar="TRACE", help="trace file (CSV, RMM log or snapshot)")
    parser.add_argument("--strategy", default="best_fit", metavar="NAME",
                        help="a strategy, a baseline (" + ", ".join(BASELINES) + "), "
                             "'learned' (plans learned from the repeating steps), a "
                             "comma-separated list, or 'all' (default best_fit)")
    parser.add_argument("--growth", default=DEFAULT_GROWTH, choices=list(GROWTH_POLICIES),
                        help=f"growth policy of the pools (default {DEFAULT_GROWTH}; fixed: "
                             "one arena, the smallest that serves the trace)")
    parser.add_argument("--recommend", action="store_true",
                        help="replay every strategy x growth policy (and a ThreadCached front) "
                             "and print the configuration to use, with the numbers behind it")
    parser.add_argument("--allocator", metavar="NAME",
                        help="replay only the events of one allocator of a trace that names "
                             "several (torch, tensorarena/default...: its allocator column)")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress on stderr (shown only on a terminal anyway)")


def _fail(message: str) -> int:
    print(f"tensorarena replay: error: {message}", file=sys.stderr)
    return 2


def _names(text: str) -> list[str]:
    from tensorarena.core.registry import STRATEGIES
    from tensorarena.trace.configs import BASELINES

    names: list[str] = []
    for part in (part.strip() for part in text.split(",")):
        if part == "all":
            names += [*STRATEGIES, *BASELINES]
        elif part:
            names.append(part)
    if not names:
        raise TensorArenaError("--strategy is empty")
    return names


def _trace_json(trace: Trace | None, summary: TraceSummary, name: str, fmt: str
                ) -> dict[str, Any]:
    return {"name": name, "format": fmt, "events": summary.events,
            "allocations": summary.allocations, "frees": summary.frees,
            "peak_live": summary.peak_live_bytes, "peak_live_blocks": summary.peak_live_blocks,
            "total_bytes": summary.total_bytes, "largest": summary.largest_bytes,
            "live_at_end": summary.live_at_end_bytes, "streams": summary.streams}


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _one_allocator(trace: Trace, name: str) -> Trace:
    """The events of allocator ``name`` (ids stay theirs: each allocator's are its own)."""
    from tensorarena.errors import InvalidArgumentError
    from tensorarena.trace.model import Trace

    kept = [event for event in trace if event.allocator == name]
    if not kept:
        named = sorted({event.allocator for event in trace if event.allocator})
        raise InvalidArgumentError(
            f"no event of allocator {name!r}; the trace names "
            + (", ".join(repr(n) for n in named) if named else "none (one allocator)"))
    return Trace.from_events(kept, name=f"{trace.name} ({name})", metadata=trace.metadata)


#: What each column of the table means, printed once under it.
LEGEND = (
    "peak reserved: the most bytes the configuration held from its upstream at once",
    "footprint: peak reserved / peak live bytes (1.000 is no overhead; the trace's peak live "
    "is every allocator's lower bound)",
    "at end: reserved / live bytes when the trace ended",
    "frag: fragmentation when the live bytes first peak, 1 - largest free block / free bytes "
    "(0%: the free bytes are one block)",
    "ns/op: wall time per allocate or free, the replay loop included",
    "failures: allocations refused for lack of memory (skipped, and so is their free)",
    "upstream: calls to the upstream for memory (arenas taken; - for the system allocators)",
)


def _table(results: dict[str, ReplayResult]) -> str:
    steady = any(r.steady_footprint_ratio is not None for r in results.values())
    header = ("configuration", "peak reserved", "footprint", *(("steady",) if steady else ()),
              "at end", "frag", "ns/op", "failures", "upstream")
    rows = [header]
    for name, r in results.items():
        rows.append((
            name,
            "-" if r.peak_reserved_bytes is None else format_size(r.peak_reserved_bytes),
            _ratio(r.footprint_ratio),
            *((_ratio(r.steady_footprint_ratio),) if steady else ()),
            _ratio(r.end_footprint_ratio),
            "-" if r.fragmentation is None else f"{r.fragmentation:.1%}",
            f"{r.ns_per_op:,.0f}", str(r.failures),
            "-" if r.upstream_allocs is None else str(r.upstream_allocs),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines += ["", *(f"  {line}" for line in LEGEND)]
    return "\n".join(lines)


def _recommendation_text(advice: Recommendation) -> str:
    lines = ["", "ranking (footprint first; within "
             f"{advice.tolerance:.0%} of the best footprint, the fastest first):"]

    results: dict[str, ReplayResult] = {}
    for entry in advice.ranking:
        mark = " (baseline)" if entry.configuration.kind not in ("pool", "learned") else ""
        results[entry.configuration.name + mark] = entry.result
    lines.append(_table(results))
    if advice.best is None:
        lines.append("\nno configuration served every allocation")
        return "\n".join(lines)
    best = advice.best
    r = best.result
    lines += [
        "",
        f"use: {best.configuration.code()}",
        f"  peak reserved {format_size(r.peak_reserved_bytes or 0)} for "
        f"{format_size(r.peak_live_bytes)} live at the peak (footprint "
        f"{_ratio(r.footprint_ratio)}), {_ratio(r.end_footprint_ratio)} when the trace ended, "
        f"{r.ns_per_op:,.0f} ns per operation, {r.upstream_allocs} upstream allocations",
    ]
    if best.configuration.growth == "fixed":
        lines.append("  (a fixed arena is sized from this trace: right when the workload "
                     "repeats, as a training step or a fixed-shape server does)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the command; return the exit status."""
    from tensorarena.errors import SystemAllocatorUnavailableError
    from tensorarena.trace.configs import configuration, read_all
    from tensorarena.trace.formats import detect_format
    from tensorarena.trace.model import LiveSet
    from tensorarena.trace.recommend import recommend

    path = Path(args.trace)
    source: Path | Trace
    try:
        configs = [configuration(name, growth=args.growth) for name in _names(args.strategy)]
        fmt = detect_format(path)
        progress = not args.quiet and not args.json
        if args.allocator is not None:
            trace = _one_allocator(read_all(path), args.allocator)
            summary, source = trace.summary(), trace
        elif fmt != "pytorch_snapshot" and os.path.getsize(path) > _STREAM_ABOVE:
            from tensorarena.trace.formats import iter_events

            live = LiveSet()
            for _ in iter_events(path, live=live):
                pass
            summary, source, trace = live.summary(), path, None
        else:
            trace = read_all(path)
            summary, source = trace.summary(), trace
        results: dict[str, ReplayResult] = {}
        skipped: dict[str, str] = {}
        for config in configs:
            if progress and sys.stderr.isatty():
                print(f"\rreplaying on {config.name}...\x1b[K", end="", file=sys.stderr,
                      flush=True)
            try:
                results[config.name] = config.run(source, progress=progress)
            except SystemAllocatorUnavailableError as why:
                skipped[config.name] = str(why)
        advice = None
        if args.recommend:
            advice = recommend(source if trace is None else trace)
        if progress and sys.stderr.isatty():
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)
    except (TensorArenaError, OSError) as exc:
        return _fail(f"{path}: {exc}" if str(path) not in str(exc) else str(exc))
    if args.json:
        data: dict[str, Any] = {
            "trace": _trace_json(trace, summary, path.stem, fmt),
            "results": {name: r.as_dict() for name, r in results.items()},
            "skipped": skipped,
        }
        if advice is not None:
            data["recommendation"] = advice.as_dict()
        print(json.dumps(data))
        return 0
    print(f"{path.name} ({fmt}): {summary.events} events, {summary.allocations} allocations, "
          f"peak live {format_size(summary.peak_live_bytes)} in {summary.peak_live_blocks} "
          f"blocks, largest {format_size(summary.largest_bytes)}")
    print(_table(results))
    for name, text in skipped.items():
        print(f"skipped {name}: {text}")
    if advice is not None:
        print(_recommendation_text(advice))
    return 0
