"""``tensorarena bench exec``: models run eagerly and through the planned arena, side by side.

For each architecture of :mod:`tensorarena.planning.models` (random weights from a config), one
run measures both executions of the same inputs:

``lower_bound``    peak of live bytes of the buffers in the arena: no plan of them is lower
``planned_arena``  the plan's height, the arena's size
``naive``          the sum of those buffers: the arena with no reuse at all
``eager_peak``     the most torch's allocator held during one eager call, above the level
                   before it (outputs included; measured with the profiler, not estimated)
``planned_peak``   the arena plus the most torch's allocator held during one planned call
                   (outputs, results left out of the plan, kernels' own temporaries)
``eager_ms``, ``planned_ms``
                   median wall time of ``--repeats`` calls, eager and planned interleaved so
                   both see the same machine
``max_abs_err``    the largest absolute difference between planned and eager outputs (for
                   ``--training``: the loss and every gradient)
``outputs``        where the planned program's outputs live (``fresh``: torch's, on top of the
                   arena; ``arena``: planned in it; ``handover``: planned in a tail of it
                   taken at each call, ``tail_bytes``), and ``reordered``, whether it ran in
                   :func:`tensorarena.planning.reorder`'s order (both the runtime's defaults
                   unless ``--outputs``/``--reorder``/``--no-reorder`` say otherwise)
``allocations``    torch allocator calls in one steady-state call: ``eager``, ``planned`` (all),
                   ``planned_intermediates`` (made while writing a planned buffer: the out and
                   copy paths) and ``scalars`` (of those, 8 bytes or less: Python numbers that
                   ATen wraps in a tensor for ops such as ``x * 0.5``). Kernels' own
                   allocations served from the arena (:mod:`tensorarena.runtime.kernel_arena`)
                   never reach torch's allocator and are not counted here
``kernel_arena``   whether kernels' own allocations were planned (``"on"``, or why not), and
                   ``kernel``: how many were planned (``buffers``, ``bytes``) and, over the
                   calls above, ``served`` from the arena and ``forwarded`` to torch

``--json`` prints ``{"models": {NAME: {...}}, "machine": {...}, ...}``. A benchmark, not a
test: it asserts nothing; on a shared machine expect latency noise of ±20 % or more.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, TextIO

from tensorarena._version import build

__all__ = ["ModelResult", "configure", "main", "measure_model", "run"]

Size = Literal["tiny", "base"]


@dataclass
class ModelResult:
    """One model's numbers (see the module docstring for each field)."""

    lower_bound: int
    planned_arena: int
    eager_peak: int
    naive: int
    eager_ms: float
    planned_ms: float
    max_abs_err: float
    planned_peak: int = 0
    graph_lower_bound: int = 0
    allocations: dict[str, int] = field(default_factory=dict)
    paths: dict[str, int] = field(default_factory=dict)
    planner: str = ""
    build_seconds: float = 0.0
    repeats: int = 0
    verified: bool = False
    outputs: str = ""
    reordered: bool = False
    kernel_arena: str = ""
    kernel: dict[str, int] = field(default_factory=dict)
    tail_bytes: int = 0
    #: one recorded planned call as a PyTorch memory snapshot (``record_memory=True``; not JSON)
    memory_snapshot: dict[str, Any] | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON (without the snapshot)."""
        data = asdict(replace(self, memory_snapshot=None))
        del data["memory_snapshot"]
        return data


class Progress:
    """A line per step on ``stream`` as it starts and one with its time when it ends (two lines,
    as torch may print its own messages in between)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.stream is not None:
            print(f"  {label} ...", file=self.stream, flush=True)
        yield
        if self.stream is not None:
            print(f"    done in {time.perf_counter() - start:.2f} s", file=self.stream, flush=True)


def _leaves(value: Any) -> list[Any]:
    import torch
    from torch.utils import _pytree as pytree

    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    return [leaf for leaf in pytree.tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _max_abs_err(got: Any, expected: Any) -> float:
    pairs = list(zip(_leaves(got), _leaves(expected), strict=True))
    return max(
        ((g.double() - e.double()).abs().max().item() for g, e in pairs if g.numel()),
        default=0.0,
    )


def _median_ms(eager: Callable[[], Any], planned: Callable[[], Any],
               repeats: int) -> tuple[float, float]:
    for _ in range(3):  # warm-up: caches, lazy initialisation, the first plan's code
        eager()
        planned()
    times: dict[str, list[float]] = {"eager": [], "planned": []}
    for i in range(repeats):
        # Alternate which goes first so neither always runs on a cache the other warmed.
        order = (("eager", eager), ("planned", planned))
        for name, fn in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["eager"]) * 1e3, statistics.median(times["planned"]) * 1e3


def measure_model(
    name: str,
    *,
    size: Size = "tiny",
    training: bool = False,
    repeats: int = 30,
    unplaceable: Literal["auto", "copy", "dynamic"] = "copy",
    verify: bool = True,
    reorder: bool | None = None,
    outputs: Literal["fresh", "arena", "handover"] | None = None,
    record_memory: bool = False,
    kernel_arena: Literal["auto", "all", "idle", "off"] | None = None,
    progress: Progress | None = None,
) -> ModelResult:
    """Build ``name``, run it eagerly and planned, and measure both (module docstring).
    ``reorder`` runs the planned program in the order :func:`tensorarena.planning.reorder`
    picks, ``outputs`` places its outputs and ``kernel_arena`` serves kernels' own
    allocations from the arena (None: the runtime's default for each);
    ``record_memory`` also records one planned call's memory
    (:meth:`~tensorarena.runtime.PlannedProgram.record_memory`) into ``memory_snapshot``."""
    import torch

    from tensorarena.planning.models import build_model
    from tensorarena.planning.torch_frontend import _default_loss
    from tensorarena.runtime import PlannedProgram, TrainingStep, trace_allocations

    progress = progress or Progress(None)
    options: dict[str, Any] = {"unplaceable": unplaceable}
    if reorder is not None:
        options["reorder"] = reorder
    if outputs is not None:
        options["outputs"] = outputs
    if kernel_arena is not None:
        options["kernel_arena"] = {"auto": True, "off": False}.get(kernel_arena, kernel_arena)
    with progress.step(f"building {name} ({size}) from its config, random weights"):
        model, (args, kwargs) = build_model(name, size=size)
    start = time.perf_counter()
    if training:
        model.train()
        with progress.step("tracing the training step (make_fx) and planning it"):
            step = TrainingStep(model, args, kwargs, **options)
            program = step.program
            planned_call: Callable[[], Any] = lambda: step(*args, **kwargs)  # noqa: E731
            torch.manual_seed(0)
            planned_out = planned_call()

        def eager_call() -> Any:
            model.zero_grad(set_to_none=True)
            loss = _default_loss(model(*args, **kwargs))
            loss.backward()  # type: ignore[no-untyped-call]
            return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

        torch.manual_seed(0)
        eager_out = eager_call()
    else:
        model.eval()
        with progress.step("exporting (torch.export) and planning"):
            program = PlannedProgram.from_module(model, args, kwargs, **options)
            planned_call = lambda: program(*args, **kwargs)  # noqa: E731
            planned_out = planned_call()

        def eager_call() -> Any:
            with torch.no_grad():
                return model(*args, **kwargs)

        eager_out = eager_call()
    build_seconds = time.perf_counter() - start
    error = _max_abs_err(planned_out, eager_out)
    del planned_out, eager_out
    verified = False
    if verify:
        with progress.step("checking with every dead buffer poisoned"):
            torch.manual_seed(0)
            program.verify(*args, **kwargs)
            verified = True
    with progress.step("measuring memory (torch profiler)"):
        torch.manual_seed(0)
        _, eager_trace = trace_allocations(eager_call)
        torch.manual_seed(0)
        _, planned_trace = program.trace_allocations(*args, **kwargs)
    snapshot = None
    if record_memory:
        with progress.step("recording one planned call's memory"):
            torch.manual_seed(0)
            _, snapshot = program.record_memory(*args, **kwargs)
    with progress.step(f"timing {repeats} calls each, interleaved"):
        eager_ms, planned_ms = _median_ms(eager_call, planned_call, repeats)
    report = program.report()
    return ModelResult(
        lower_bound=report.lower_bound,
        planned_arena=report.planned_bytes,
        eager_peak=eager_trace.peak_bytes,
        naive=report.naive_bytes,
        eager_ms=eager_ms,
        planned_ms=planned_ms,
        max_abs_err=error,
        planned_peak=report.planned_bytes + planned_trace.peak_bytes,
        graph_lower_bound=report.graph_lower_bound,
        allocations={
            "eager": eager_trace.allocations,
            "planned": planned_trace.allocations,
            "planned_intermediates": planned_trace.planned_allocations,
            "scalars": planned_trace.small_planned_allocations,
        },
        paths=report.counts,
        planner=report.planner,
        build_seconds=build_seconds,
        repeats=repeats,
        verified=verified,
        outputs=program.outputs,
        reordered=program.reordered,
        kernel_arena=report.kernel_arena,
        kernel={"buffers": report.kernel_buffers, "bytes": report.kernel_bytes,
                "served": report.kernel_served, "forwarded": report.kernel_forwarded,
                "escaped": report.kernel_escaped},
        tail_bytes=report.tail_bytes,
        memory_snapshot=snapshot,
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's arguments."""
    from tensorarena.planning.models import ARCHITECTURES

    parser.add_argument("--model", action="append", choices=ARCHITECTURES, metavar="NAME",
                        help=f"measure only this model (repeatable): {', '.join(ARCHITECTURES)}")
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny",
                        help="tiny (two layers, seconds) or base (published sizes, minutes)")
    parser.add_argument("--training", action="store_true",
                        help="a training step (forward, loss, every gradient) instead of inference")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls each (default 30)")
    parser.add_argument("--unplaceable", choices=("auto", "copy", "dynamic"), default="copy",
                        help="results of ops without an out variant: copied into the arena "
                             "(default) or left where the op put them")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch intra-op threads (default: torch's). On a shared machine "
                             "use 1: a parallel op waits for its slowest thread, and one thread "
                             "descheduled by another process stalls it for milliseconds")
    parser.add_argument("--reorder", action=argparse.BooleanOptionalAction, default=None,
                        help="run each planned graph in the order tensorarena.planning.reorder "
                             "picks (memory-aware operator reordering; default: the runtime's, "
                             "on for training steps)")
    parser.add_argument("--outputs", choices=("fresh", "arena", "handover"), default=None,
                        help="outputs made by torch at each call, planned in the arena, or "
                             "planned in a tail of it handed over at each call (default: the "
                             "runtime's, arena for training steps)")
    parser.add_argument("--kernel-arena", choices=("auto", "all", "idle", "off"), default=None,
                        help="serve kernels' own allocations from the arena: all, only where "
                             "the arena has idle bytes, or off (default: the runtime's, auto: "
                             "all for planned outputs, idle for fresh ones, where its C++ shim "
                             "builds)")
    parser.add_argument("--quick", action="store_true", help="5 repeats, no poisoned check")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:.1f}"


def _print_table(results: dict[str, ModelResult], skipped: dict[str, str]) -> None:
    header = ("model", "LB KiB", "arena KiB", "arena/LB", "naive KiB", "eager peak",
              "planned peak", "eager ms", "planned ms", "max |err|", "allocs e/p/int")
    rows = [header]
    for name, r in results.items():
        ratio = r.planned_arena / r.lower_bound if r.lower_bound else 1.0
        allocs = r.allocations
        rows.append((name, _kib(r.lower_bound), _kib(r.planned_arena), f"{ratio:.3f}",
                     _kib(r.naive), _kib(r.eager_peak), _kib(r.planned_peak),
                     f"{r.eager_ms:.2f}", f"{r.planned_ms:.2f}", f"{r.max_abs_err:.1e}",
                     f"{allocs['eager']}/{allocs['planned']}/{allocs['planned_intermediates']}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    for name, why in skipped.items():
        print(f"  {name}: skipped ({why})")


def run(args: argparse.Namespace) -> int:
    """Measure the chosen models; print a table (or JSON with ``--json``); return 0."""
    from tensorarena._optional import require
    from tensorarena.planning.models import ARCHITECTURES

    torch = require("torch", extra="torch", feature="tensorarena bench exec")
    require("transformers", extra="torch", feature="tensorarena bench exec")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = args.model or list(ARCHITECTURES)
    repeats = 5 if args.quick else args.repeats
    mode = "training" if args.training else "inference"
    stream = None if args.json else sys.stderr
    if not args.json:
        print(f"bench exec: {mode}, size {args.size}, {os.cpu_count()} CPUs, "
              f"{torch.get_num_threads()} torch threads, "
              f"median of {repeats} calls, unplaceable={args.unplaceable}"
              + (f", reorder={args.reorder}" if args.reorder is not None else "")
              + (f", outputs={args.outputs}" if args.outputs is not None else "")
              + (f", kernel_arena={args.kernel_arena}" if args.kernel_arena is not None else ""))
    results: dict[str, ModelResult] = {}
    skipped: dict[str, str] = {}
    for name in names:
        if stream is not None:
            print(f"{name}:", file=stream)
        try:
            results[name] = measure_model(
                name, size=args.size, training=args.training, repeats=repeats,
                unplaceable=args.unplaceable, verify=not args.quick, reorder=args.reorder,
                outputs=args.outputs, kernel_arena=args.kernel_arena,
                progress=Progress(stream),
            )
        except Exception as exc:  # one architecture that fails here must not hide the others
            skipped[name] = f"{type(exc).__name__}: {exc}"
            if stream is not None:
                print(f"  failed: {skipped[name]}", file=stream)
    if args.json:
        print(json.dumps({
            "models": {name: r.as_dict() for name, r in results.items()},
            "skipped": skipped,
            "mode": mode,
            "size": args.size,
            "unplaceable": args.unplaceable,
            "reorder": args.reorder,
            "outputs": args.outputs,
            "kernel_arena": args.kernel_arena,
            "build": build(),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        }, indent=2))
    else:
        _print_table(results, skipped)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (``python bench/exec.py``)."""
    parser = argparse.ArgumentParser(prog="bench/exec.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    return run(parser.parse_args(argv))
