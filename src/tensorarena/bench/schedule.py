"""``tensorarena bench schedule``: memory-aware reordering on real models' graphs.

For each architecture of :mod:`tensorarena.planning.models`, inference (``torch.export``) and
training (forward, loss and gradients through ``make_fx``), it reports the lower bound of the
graph as traced, the lowest peak of Inductor's three heuristics (LPMF, BFS, DFS, reimplemented in
:mod:`tensorarena.planning.schedules`), and what :func:`tensorarena.planning.reorder` reaches: the
reordered graph's lower bound, the height of its plan, and a bound below which no order can go.
``--json`` prints one object::

    {"models": {NAME: {"lower_bound": int, "reordered_lower_bound": int,
                       "reordered_height": int, "inductor_best": int, "order_bound": int,
                       "method": str, "seconds": float}}, "machine": {...}, ...}

with NAME such as ``gpt2-training``. Numbers only, no assertion; ``seconds`` is reordering and
planning, not tracing. Models that cannot be built here are skipped, saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

from tensorarena._version import build

__all__ = ["configure", "main", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's arguments."""
    parser.add_argument("--size", choices=("tiny", "base"), default="base",
                        help="model configurations (default base; tiny for a smoke run)")
    parser.add_argument("--names", default="",
                        help="comma-separated architectures (default: all nine)")
    parser.add_argument("--mode", choices=("both", "inference", "training"), default="both")
    parser.add_argument("--time-limit", type=float, default=30.0, metavar="SECONDS",
                        help="search over orders per graph (default 30; plans add a few s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _row(graph: Any, time_limit: float) -> dict[str, Any]:
    from tensorarena.planning.reorder import reorder

    started = time.perf_counter()
    result = reorder(graph, time_limit=time_limit)
    seconds = time.perf_counter() - started
    schedule = result.schedule
    return {
        "lower_bound": schedule.original_lower_bound,
        "reordered_lower_bound": schedule.lower_bound,
        "reordered_height": result.height,
        "inductor_best": schedule.inductor_best,
        "order_bound": schedule.bound,
        "method": schedule.method,
        "seconds": round(seconds, 3),
    }


def run(args: argparse.Namespace) -> int:
    """Reorder every graph and print the table (or one JSON object); return 0."""
    from tensorarena.errors import ModelSkippedWarning, UnknownNameError
    from tensorarena.planning.models import ARCHITECTURES, model_graph

    names = [n.strip() for n in args.names.split(",") if n.strip()] or list(ARCHITECTURES)
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown:  # a typo is an error, not nine skipped graphs and exit 0
        raise UnknownNameError(
            f"unknown architecture(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(ARCHITECTURES)}", kind="architecture", name=unknown[0],
            known=tuple(ARCHITECTURES),
        )
    modes = {"both": (False, True), "inference": (False,), "training": (True,)}[args.mode]
    rows: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    if not args.json:
        print(f"bench schedule: {args.size} models, {args.time_limit:g} s per graph, "
              f"{os.cpu_count()} CPUs")
    for name in names:
        for training in modes:
            label = f"{name}-{'training' if training else 'inference'}"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    graph = model_graph(name, size=args.size, training=training)
                rows[label] = _row(graph, args.time_limit)
            except Exception as exc:  # one model that cannot be built must not stop the rest
                skipped[label] = f"{type(exc).__name__}: {exc}"
                warnings.warn(f"skipped {label}: {exc}", ModelSkippedWarning, stacklevel=2)
                continue
            if not args.json:
                _print_row(label, rows[label])
    if args.json:
        print(json.dumps({
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count()},
            "build": build(), "size": args.size, "time_limit": args.time_limit, "models": rows,
            "skipped": skipped,
        }))
    else:
        _print_summary(rows)
    return 0


def _print_row(label: str, row: dict[str, Any]) -> None:
    base = row["lower_bound"]
    print(f"  {label:28s} LB {base:>12d}  inductor {row['inductor_best'] / base:.4f}  "
          f"reordered {row['reordered_lower_bound'] / base:.4f} ({row['method']})  "
          f"height {row['reordered_height'] / base:.4f}  order bound "
          f"{row['order_bound'] / base:.4f}  {row['seconds']:.1f} s", flush=True)


def _print_summary(rows: dict[str, dict[str, Any]]) -> None:
    training = [r for label, r in rows.items() if label.endswith("-training")]
    below = sum(r["reordered_lower_bound"] < r["inductor_best"] for r in training)
    above = [label for label, r in rows.items() if r["reordered_lower_bound"] > r["inductor_best"]]
    print(f"strictly below Inductor's best on {below} of {len(training)} training graphs; "
          f"above it on {len(above)} graph(s){': ' + ', '.join(above) if above else ''}")


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (``python -m tensorarena.bench.schedule``)."""
    parser = argparse.ArgumentParser(prog="tensorarena bench schedule", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
