"""``tensorarena demo``: one model run eagerly and through the planned arena, and what it saved.

The default is a GPT-2-architecture model built from a config with random weights (nothing is
downloaded). It is traced, planned, checked (outputs against eager, then once more with every
dead buffer poisoned), measured (peak memory with the profiler, latency as the median of
interleaved calls) and summed up in a short report. Each step prints as it starts, with its time
when done. ``--model NAME`` picks another architecture, ``--training`` a training step (forward,
loss and every gradient as one planned program), ``--size base`` the published size,
``--reorder`` runs the nodes in the order :func:`tensorarena.planning.reorder` picks.

It also records one planned call (:meth:`~tensorarena.runtime.PlannedProgram.record_memory`:
every planned buffer at its place in the arena, the dynamic pool, torch's own allocations) and
writes it as a self-contained HTML memory timeline, ``tensorarena-demo.html`` in the current
directory unless ``--html PATH`` or ``--no-html`` says otherwise. The page needs plotly (the
``viz`` extra); without it the demo says so and carries on.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_HTML", "configure", "main", "run"]

#: Where the memory timeline goes unless ``--html``/``--no-html`` say otherwise.
DEFAULT_HTML = "tensorarena-demo.html"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the demo's arguments."""
    from tensorarena.planning.models import ARCHITECTURES

    parser.add_argument("--model", default="gpt2", choices=ARCHITECTURES, metavar="NAME",
                        help=f"architecture (default gpt2): {', '.join(ARCHITECTURES)}")
    parser.add_argument("--training", action="store_true",
                        help="a training step (forward, loss, every gradient) instead of inference")
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny",
                        help="tiny (two layers, seconds; default) or base (published size)")
    parser.add_argument("--reorder", action=argparse.BooleanOptionalAction, default=None,
                        help="run the planned graph in the order tensorarena.planning.reorder "
                             "picks (memory-aware operator reordering; default: the runtime's, "
                             "on for training steps)")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls each (default 30)")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    parser.add_argument("--html", default=DEFAULT_HTML, metavar="PATH",
                        help=f"write the planned call's memory timeline here (default "
                             f"{DEFAULT_HTML})")
    parser.add_argument("--no-html", dest="html", action="store_const", const=None,
                        help="do not record or write the memory timeline")


def _size(nbytes: int) -> str:
    from tensorarena.sizes import format_size

    return format_size(nbytes)


def _html_path(path: str | None) -> Path | None:
    """The page to write, or None (``--no-html``, or plotly missing: said once, then on)."""
    if path is None:
        return None
    from tensorarena._optional import require
    from tensorarena.errors import MissingDependencyError

    try:
        require("plotly", extra="viz", feature="the HTML memory timeline")
    except MissingDependencyError as exc:
        print(f"tensorarena demo: {exc}; carrying on without it", file=sys.stderr)
        return None
    return Path(path)


def _write_timeline(snapshot: dict[str, Any], path: Path, name: str) -> None:
    from tensorarena.report.timeline import timeline_from_snapshot
    from tensorarena.report.viz import write_html

    timeline = timeline_from_snapshot(snapshot, name=name)
    write_html(timeline, path)
    print(f"wrote {path}: the memory timeline of one planned call ({timeline.blocks:,} "
          "blocks: the arena's slots, the dynamic pool, torch's allocations)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Run the demo; print the report; return 0 (1 if the planned outputs differ)."""
    from tensorarena._optional import require
    from tensorarena.bench.exec import Progress, measure_model

    require("torch", extra="torch", feature="tensorarena demo")
    require("transformers", extra="torch", feature="tensorarena demo")
    mode = "training step" if args.training else "inference"
    print(f"tensorarena demo: {args.model} ({args.size}, {mode}), random weights, CPU",
          file=sys.stderr)
    html = _html_path(args.html)
    result = measure_model(args.model, size=args.size, training=args.training,
                           repeats=args.repeats, reorder=args.reorder,
                           record_memory=html is not None,
                           progress=Progress(sys.stderr))
    correct = result.max_abs_err == 0 or result.max_abs_err < 1e-5
    if html is not None and result.memory_snapshot is not None:
        _write_timeline(result.memory_snapshot, html, f"{args.model} ({args.size}, {mode}), "
                        "one planned call")
    if args.json:
        print(json.dumps({"model": args.model, "size": args.size, "mode": mode,
                          **result.as_dict()}, indent=2))
        return 0 if correct else 1
    ratio = result.planned_arena / result.lower_bound if result.lower_bound else 1.0
    speed = result.eager_ms / result.planned_ms if result.planned_ms else 0.0
    allocs = result.allocations
    paths = ", ".join(f"{k} {v}" for k, v in result.paths.items() if v)
    lines = [
        "",
        f"{args.model} ({args.size}, {mode}) in one planned arena",
        f"  lower bound        {_size(result.lower_bound):>10}   peak of live planned bytes: "
        "no plan is lower",
        f"  planned arena      {_size(result.planned_arena):>10}   x{ratio:.3f} of the lower "
        f"bound ({result.planner})",
        f"  no reuse (naive)   {_size(result.naive):>10}   every intermediate its own bytes",
        f"  eager peak         {_size(result.eager_peak):>10}   measured: torch's allocator "
        "during one eager call",
        f"  planned peak       {_size(result.planned_peak):>10}   the arena plus what torch "
        "allocated during one planned call",
        f"  latency            eager {result.eager_ms:.2f} ms, planned {result.planned_ms:.2f} ms"
        f" (x{speed:.2f}; median of {result.repeats})",
        f"  allocator calls    eager {allocs['eager']}, planned {allocs['planned']} per call "
        f"({allocs['planned_intermediates']} while writing planned buffers, "
        f"{allocs['scalars']} of them wrapped scalars)",
        f"  correctness        max |planned - eager| = {result.max_abs_err:.1e}"
        f" ({'equal' if correct else 'DIFFERENT'}); poisoned check "
        f"{'passed' if result.verified else 'not run'}",
        f"  nodes              {paths}",
    ]
    print("\n".join(lines))
    return 0 if correct else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point."""
    parser = argparse.ArgumentParser(prog="tensorarena demo", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))
