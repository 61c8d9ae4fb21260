"""``tensorarena demo``: GPT-2 124M run eagerly and through the planned arena, side by side.

The default is GPT-2 small (124M parameters) at its published size, built from its config with
random weights (nothing is downloaded), on one sequence of 128 tokens. Eager and planned each run
in a fresh process (:mod:`tensorarena.bench.exec_worker`), so each one's memory is its own: the
live peak (torch's allocator during a call, plus the arena) and the process's peak resident memory
during a call, above the weights and inputs. The planned process also checks its outputs against
eager's, once more with every dead buffer poisoned, and times both interleaved. Resident memory
differs between identical processes (glibc's heap: by up to a third for GPT-2's eager calls);
``tensorarena bench exec --processes 3`` takes the median of three. Each step prints
as it starts, with its time when done. ``--model NAME`` picks another architecture, ``--training``
a training step (forward, loss and every gradient as one planned program), ``--size tiny`` the
two-layer configs (seconds), ``--reorder`` the order :func:`tensorarena.planning.reorder` picks.

It also records one planned call (:meth:`~tensorarena.runtime.PlannedProgram.record_memory`:
every planned buffer at its place in the arena, the dynamic pool, torch's own allocations) and
one eager call (:func:`~tensorarena.trace.record_torch`, its blocks laid out by a best-fit pool)
and writes them side by side on one scale as a self-contained HTML page
(:mod:`tensorarena.report.compare`), ``tensorarena-demo.html`` in the current directory unless
``--html PATH`` or ``--no-html`` says otherwise. The page needs plotly (the
``viz`` extra); without it the demo says so and carries on.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_HTML", "configure", "main", "run"]

#: Where the memory timeline goes unless ``--html``/``--no-html`` say otherwise.
DEFAULT_HTML = "tensorarena-demo.html"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the demo's arguments."""
    from tensorarena.planning.models import ARCHITECTURES, VARIANTS

    names = (*ARCHITECTURES, *VARIANTS)
    parser.add_argument("--model", default="gpt2", choices=names, metavar="NAME",
                        help=f"architecture (default gpt2): {', '.join(names)}")
    parser.add_argument("--training", action="store_true",
                        help="a training step (forward, loss, every gradient) instead of inference")
    parser.add_argument("--size", choices=("tiny", "base"), default="base",
                        help="base (published size, realistic shape; default) or tiny (two "
                             "layers, seconds)")
    parser.add_argument("--reorder", action=argparse.BooleanOptionalAction, default=None,
                        help="run the planned graph in the order tensorarena.planning.reorder "
                             "picks (memory-aware operator reordering; default: the runtime's, "
                             "on for training steps)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed rounds of eager and planned (default 3)")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="torch intra-op threads in each process (default 1; 0: torch's)")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    parser.add_argument("--html", default=DEFAULT_HTML, metavar="PATH",
                        help=f"write the planned call's memory timeline here (default "
                             f"{DEFAULT_HTML})")
    parser.add_argument("--no-html", dest="html", action="store_const", const=None,
                        help="do not record or write the memory timeline")


def _size(nbytes: int | None) -> str:
    from tensorarena.sizes import format_size

    return "-" if nbytes is None else format_size(nbytes)


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


def _write_timeline(snapshot: dict[str, Any], eager: Path | None, path: Path, name: str) -> None:
    """The page: the eager call (when its trace was recorded) beside the planned call."""
    from tensorarena.report.compare import write_comparison
    from tensorarena.report.timeline import load_timeline, timeline_from_snapshot

    planned = timeline_from_snapshot(snapshot, name="planned")
    timelines, titles = [planned], ["planned"]
    if eager is not None and eager.exists():
        timelines.insert(0, load_timeline(eager))
        titles.insert(0, "eager")
    write_comparison(timelines, titles, path, heading=f"{name}: eager and planned")
    print(f"wrote {path}: one {' and one '.join(titles)} call side by side on one scale "
          f"({planned.blocks:,} planned blocks: the arena's slots, the dynamic pool, torch's "
          "allocations)", file=sys.stderr)


def _measure(args: argparse.Namespace, snapshot: Path | None, trace: Path | None
             ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Eager and planned, each in its own process, both at once (two cores): the config and
    both processes' results."""
    from tensorarena.bench.exec_configs import Config, suite
    from tensorarena.bench.exec_subprocess import Progress, RunOptions, make_job, run_job

    config = next(iter(suite(args.size, models=[args.model],
                             mode="training" if args.training else "inference")),
                  Config(args.model, args.size, training=args.training))
    options = {} if args.reorder is None else {"reorder": args.reorder}
    run = RunOptions(executions=("eager", "planned"), repeats=args.repeats, calls=1,
                     threads=args.threads or None, options=options, timeout=1800.0)
    eager_job = make_job(config, run, memory="eager",
                         trace=None if trace is None else str(trace))
    planned_job = make_job(config, run, memory="planned", latency=("eager", "planned"),
                           verify=True, snapshot=None if snapshot is None else str(snapshot))
    step = Progress(sys.stderr).step(f"{config.label}: eager and planned, each in a fresh "
                                     "process (build, export and plan, measure, check, time)")
    with step, ThreadPoolExecutor(max_workers=2) as pool:
        eager, planned = pool.map(lambda job: run_job(job, timeout=run.timeout),
                                  (eager_job, planned_job))
    return config, eager, planned


def _failure(result: dict[str, Any]) -> str | None:
    why = result.get("error") or result.get("memory", {}).get("error")
    return None if why is None else str(why)


def run(args: argparse.Namespace) -> int:
    """Run the demo; print the report; return 0 (1 if the planned outputs differ or a process
    failed)."""
    from tensorarena._optional import require
    from tensorarena.bench.exec_subprocess import ratios

    require("torch", extra="torch", feature="tensorarena demo")
    require("transformers", extra="torch", feature="tensorarena demo")
    mode = "training step" if args.training else "inference"
    print(f"tensorarena demo: {args.model} ({args.size}, {mode}), random weights, CPU, "
          f"{args.threads or 'all'} thread(s)", file=sys.stderr)
    html = _html_path(args.html)
    with tempfile.TemporaryDirectory(prefix="tensorarena-demo-") as folder:
        snapshot_path = None if html is None else Path(folder) / "snapshot.pickle"
        eager_path = None if html is None else Path(folder) / "eager.csv"
        config, eager, planned = _measure(args, snapshot_path, eager_path)
        for name, result in (("eager", eager), ("planned", planned)):
            if _failure(result):
                print(f"tensorarena demo: the {name} process failed: {_failure(result)}",
                      file=sys.stderr)
                return 1
        if snapshot_path is not None and html is not None and snapshot_path.exists():
            with snapshot_path.open("rb") as file:
                snapshot = pickle.load(file)  # written by our own worker, just now
            _write_timeline(snapshot, eager_path, html, f"{args.model} ({args.size}, {mode})")
    numbers = {"eager": eager["memory"], "planned": planned["memory"]}
    latency = planned["latency"]
    for name, ms in latency["ms"].items():
        numbers[name]["ms"] = ms
    error = latency["max_abs_err"].get("planned")
    correct = error is not None and error < 1e-5
    details = planned["details"]
    if args.json:
        print(json.dumps({"model": args.model, "size": args.size, "mode": mode,
                          "config": config.as_dict(), "executions": numbers,
                          "ratios": ratios(numbers)["planned/eager"], "planned": details,
                          "max_abs_err": error, "skipped": latency["skipped"]}, indent=2))
        return 0 if correct else 1
    print("\n".join(_report(config, args, numbers, details, latency, error, correct)))
    return 0 if correct else 1


def _report(config: Any, args: argparse.Namespace, numbers: dict[str, dict[str, Any]],
            details: dict[str, Any], latency: dict[str, Any], error: float | None,
            correct: bool) -> list[str]:
    from tensorarena.bench.exec_subprocess import ratios

    eager, planned = numbers["eager"], numbers["planned"]
    ratio = ratios(numbers)["planned/eager"]
    lower = details["lower_bound"]

    def row(label: str, key: str, what: str, fmt: Any = _size) -> str:
        times = ratio.get(key)
        return (f"  {label:<20}{fmt(eager.get(key)):>11}{fmt(planned.get(key)):>12}"
                f"{'' if times is None else f'x{times:.2f}':>14}   {what}")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} ms"

    paths = ", ".join(f"{k} {v}" for k, v in details["paths"].items() if v)
    mode = "training step" if args.training else "inference"
    arena = details["planned_arena"]
    return [
        "",
        f"{config.label} ({args.size}, {mode}): eager and planned, each in a fresh process",
        f"  {'':<20}{'eager':>11}{'planned':>12}{'planned/eager':>14}",
        row("live peak", "live_peak", "torch's allocator during one call (planned: + the "
            "arena)"),
        row("process peak", "rss_peak", "resident memory during one call, above the weights "
            "and inputs"),
        row("held, outputs kept", "rss_held", "resident after the call, the outputs alive"),
        row("held, dropped", "rss_held_dropped", "resident between calls, the outputs dropped"),
        row("after empty_cache", "rss_held_released", "and after tensorarena.empty_cache(): "
            "the idle arena's pages go back"),
        row("latency", "ms", f"median of {latency['repeats']} interleaved rounds", ms),
        f"  lower bound        {_size(lower):>10}   peak of live planned bytes: no plan is lower",
        f"  planned arena      {_size(arena):>10}   x{arena / lower if lower else 1.0:.3f} of "
        f"the lower bound ({details['planner']}); outputs {details['outputs']}",
        f"  no reuse (naive)   {_size(details['naive']):>10}   every intermediate its own bytes",
        f"  allocator calls    eager {eager['allocations']}, planned {planned['allocations']} "
        f"per call ({planned.get('planned_allocations', 0)} while writing planned buffers, "
        f"{planned.get('scalar_allocations', 0)} of them wrapped scalars)",
        f"  correctness        max |planned - eager| = "
        f"{'-' if error is None else f'{error:.1e}'} ({'equal' if correct else 'DIFFERENT'}); "
        f"poisoned check {_verified(details)}",
        f"  nodes              {paths}",
    ]


def _verified(details: dict[str, Any]) -> str:
    if details["verified"]:
        return "passed"
    return f"FAILED ({details['verify_error']})" if "verify_error" in details else "not run"


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point."""
    parser = argparse.ArgumentParser(prog="tensorarena demo", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))
