"""``tensorarena bench exec``: real models run eagerly, planned and compiled, as a user runs them.

For each configuration of :mod:`tensorarena.bench.exec_configs` (``--size base``: GPT-2 124M,
BERT-base, a 135M Llama, T5-small, ViT-B/16, a ResNet-50 layout and Whisper-tiny's encoder at
realistic shapes, and GPT-2 and BERT training steps; random weights from each config) and each
execution (``eager``; ``planned``: :class:`~tensorarena.runtime.PlannedProgram` or
:class:`~tensorarena.runtime.TrainingStep` at the runtime's defaults; ``compiled``:
``torch.compile`` with Inductor on the CPU; ``exported``: ``torch.export``'s module called as
eager is, what any export-based runtime pays before planning), one fresh process measures
memory, so no execution sees another's heap (:mod:`tensorarena.bench.exec_worker` says exactly how):

``live_peak``         the most bytes live during one call: torch allocator's peak (profiler),
                      plus the planned arena, which torch never sees
``rss_peak``          the process's peak resident memory during a call above its baseline (after
                      imports, weights and inputs; ``VmHWM`` reset through ``/proc``)
``rss_held``          resident above the baseline after a call, its outputs kept;
``rss_held_dropped``  and with them dropped: what the execution holds between calls
``rss_held_released`` and that after :func:`tensorarena.empty_cache` (the execution kept: a
                      planned program's idle arena goes back page by page)
``rss_after_delete``  and once the execution is deleted and :func:`tensorarena.empty_cache`
                      ran: what it leaves in the process for good
``ms``                median wall time of ``--repeats`` rounds in one more process, the
                      executions interleaved so all see the same machine
``library_rss``       what the execution's library took once per process, measured on a
                      two-layer model before the baseline (export's imports, Inductor's), and
                      ``baseline_rss``, the baseline itself

and ``ratios`` of each (``planned/eager``, ``compiled/eager``), ``max_abs_err`` against eager's
outputs, and the plan's details (``planned``: lower bound, arena, paths, allocator calls). An
execution that fails, crashes or runs past ``--timeout`` is listed under ``skipped`` with the
reason; ``--no-compile`` leaves Inductor out, ``--no-export`` the exported module. ``--json``
prints ``{"models": {LABEL: {...}}, "machine": {...}, ...}``. A benchmark, not a test: it
asserts nothing; on a shared machine expect noticeable latency noise (``--threads``,
default 1, keeps the noise down), and resident memory that differs by up to a third between
identical processes (glibc's heap: ``--processes 3`` keeps the median of three).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

from tensorarena._version import build
from tensorarena.bench.exec_configs import suite
from tensorarena.bench.exec_subprocess import Progress, RunOptions, measure_config

__all__ = ["configure", "machine", "main", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's arguments."""
    from tensorarena.planning.models import ARCHITECTURES, VARIANTS

    names = (*ARCHITECTURES, *VARIANTS)
    parser.add_argument("--model", action="append", choices=names, metavar="NAME",
                        help=f"measure only this architecture (repeatable): {', '.join(names)}")
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny",
                        help="tiny (two layers, seconds each) or base (published sizes at "
                             "realistic shapes; most of an hour on two cores)")
    parser.add_argument("--mode", choices=("all", "inference", "training"), default="all",
                        help="inference, training steps, or both (default)")
    parser.add_argument("--training", dest="mode", action="store_const", const="training",
                        help="training steps only (as --mode training)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave torch.compile (Inductor) out: it compiles for minutes at base")
    parser.add_argument("--no-export", dest="export", action="store_false",
                        help="leave the exported execution out (torch.export's module, called "
                             "as eager: what the export alone costs)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed rounds (default 20 tiny, 5 base; 3 with --quick)")
    parser.add_argument("--processes", type=int, default=1, metavar="N",
                        help="measure each execution's memory in N processes and keep the "
                             "median (resident memory varies between processes; default 1)")
    parser.add_argument("--calls", type=int, default=2,
                        help="measured calls per memory process (default 2; the largest counts)")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="torch intra-op threads in each process (default 1: on a shared "
                             "machine a parallel op waits for its slowest thread; 0: torch's)")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="longest one process may run (default 600 tiny, 2400 base)")
    parser.add_argument("--unplaceable", choices=("auto", "copy", "dynamic"), default=None,
                        help="the planned program's unplaceable option (default: the runtime's)")
    parser.add_argument("--reorder", action=argparse.BooleanOptionalAction, default=None,
                        help="the planned program's reorder option (default: the runtime's)")
    parser.add_argument("--outputs", choices=("fresh", "arena", "handover"), default=None,
                        help="the planned program's outputs option (default: the runtime's)")
    parser.add_argument("--kernel-arena", choices=("auto", "all", "idle", "off"), default=None,
                        help="the planned program's kernel_arena option (default: the runtime's)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 measured call")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _planned_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key in ("unplaceable", "reorder", "outputs"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.kernel_arena is not None:
        options["kernel_arena"] = {"auto": True, "off": False}.get(args.kernel_arena,
                                                                   args.kernel_arena)
    return options


def machine(threads: int | None) -> dict[str, Any]:
    """The machine a run measured: CPU model, cores, torch version, threads per process."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            cpu = next((line.split(":", 1)[1].strip() for line in file
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": threads or torch.get_num_threads(), "python": platform.python_version(),
            "platform": platform.platform()}


def _size(value: int | None) -> str:
    from tensorarena.sizes import format_size

    return "-" if value is None else format_size(value)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _print_table(results: dict[str, dict[str, Any]]) -> None:
    header = ("config", "execution", "live peak", "RSS peak", "held", "held, dropped",
              "emptied", "after del", "ms", "live x", "RSS x", "held x", "ms x")
    rows = [header]
    for label, result in results.items():
        for i, (name, n) in enumerate(result["executions"].items()):
            ratio = result["ratios"].get(f"{name}/eager", {})
            ms = n.get("ms")
            rows.append((label if i == 0 else "", name, _size(n["live_peak"]),
                         _size(n["rss_peak"]), _size(n["rss_held"]), _size(n["rss_held_dropped"]),
                         _size(n.get("rss_held_released")), _size(n.get("rss_after_delete")),
                         "-" if ms is None else f"{ms:.1f}",
                         *(_ratio(ratio.get(key)) for key in
                           ("live_peak", "rss_peak", "rss_held", "ms"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    print("  (RSS and held: above each process's baseline of imports, weights and inputs; "
          "x: against eager's in the same config)")
    for label, result in results.items():
        for name, why in result["skipped"].items():
            print(f"  {label}: {name} skipped ({why})")
        if "latency_error" in result:
            print(f"  {label}: no latency ({result['latency_error']})")
        errors = {k: v for k, v in result.get("max_abs_err", {}).items() if v}
        if errors:
            print(f"  {label}: max |x - eager| " + ", ".join(f"{k} {v:.1e}"
                                                           for k, v in errors.items()))


def run(args: argparse.Namespace) -> int:
    """Measure the chosen configurations; print a table (or JSON with ``--json``); return 0."""
    from tensorarena._optional import require

    require("torch", extra="torch", feature="tensorarena bench exec")
    require("transformers", extra="torch", feature="tensorarena bench exec")
    base = args.size == "base"
    repeats = 3 if args.quick else args.repeats or (5 if base else 20)
    executions = (("eager", "planned") + (("compiled",) if args.compile else ())
                  + (("exported",) if args.export else ()))
    options = RunOptions(executions=executions, repeats=repeats, calls=1 if args.quick
                         else args.calls, threads=args.threads or None,
                         options=_planned_options(args),
                         timeout=args.timeout or (2400.0 if base else 600.0),
                         processes=args.processes)
    configs = suite(args.size, models=args.model, mode=args.mode)
    about = machine(options.threads)
    print(f"bench exec: size {args.size}, {len(configs)} configs x {', '.join(executions)}, "
          f"a process each; {about['cpu']}, {about['cores']} cores, {about['threads']} torch "
          f"threads, median of {repeats} rounds", file=sys.stderr)
    results: dict[str, dict[str, Any]] = {}
    for config in configs:
        print(f"{config.label}:", file=sys.stderr)
        results[config.label] = measure_config(config, options, Progress(sys.stderr))
    if args.json:
        print(json.dumps({"models": results, "size": args.size, "mode": args.mode,
                          "executions": list(executions), "options": options.options,
                          "processes": options.processes,
                          "repeats": repeats, "calls": options.calls, "build": build(),
                          "machine": about}, indent=2))
    else:
        print(f"bench exec: size {args.size}; {about['cpu']}, {about['cores']} cores, torch "
              f"{about['torch']}, {about['threads']} threads")
        _print_table(results)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m tensorarena.bench.exec``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench exec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
