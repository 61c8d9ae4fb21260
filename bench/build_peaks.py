"""A planned program's build at real size: resident memory at its peaks, with each of the
parent's build-time savings turned off in turn.

Two things the planned program's process used to do that nothing runs:

* ``compile-here``: compile the generated function in this process (its syntax tree, ~100
  bytes of C heap per character of source), where ``runtime.source_compile`` has a child
  interpreter do it;
* ``eager-fx``: read the exported program back with an eager FX module, which writes and
  compiles the whole graph's ``forward``, where ``runtime.export_wire.lazy_graph_modules``
  makes FX's lazy one (``--training``: the traced step's module, where
  ``planning.torch_training.lazy_modules`` does).

Each variant (``planned`` as shipped, each saving turned off, both, and eager for the ratio)
runs in its own fresh process as ``bench/process_floor.py`` does (libraries warmed on a tiny
model, then the full-size model and its inputs, then the baseline), ``--rounds`` times in
rotating order; the medians, in MiB above the baseline: the build's peak, what it leaves, the
first call's peak, the steady call's (the last of ``--calls``), and what stays after ``del``
and ``tensorarena.empty_cache()``; and for the planned program, the peak of compiling its code
in the process (``compile()``, what ``compile-here`` does at every new shape).

    .venv/bin/python bench/build_peaks.py [--model llama] [--batch 1] [--seq 256] [--rounds 3]
    .venv/bin/python bench/build_peaks.py --training --model gpt2 --batch 2 --seq 128

Linux only (``/proc/self/status``); elsewhere it says so and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import subprocess
import sys
from typing import Any

MIB = 1 << 20
#: Each variant: the execution and the savings turned off.
VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "eager": ("eager", ()),
    "planned": ("planned", ()),
    "planned, compile-here": ("planned", ("compile-here",)),
    "planned, eager-fx": ("planned", ("eager-fx",)),
    "planned, both": ("planned", ("compile-here", "eager-fx")),
}
STAGES = ("build_peak", "built", "first_peak", "steady_peak", "after_del")


def turn_off(savings: tuple[str, ...]) -> None:
    """Undo the named savings in this process (the child's side)."""
    if "compile-here" in savings:
        from tensorarena.runtime import source_compile

        source_compile.ELSEWHERE_FROM = sys.maxsize
    if "eager-fx" in savings:
        from tensorarena.planning import torch_training
        from tensorarena.runtime import export_wire

        export_wire.lazy_graph_modules = lambda th: contextlib.nullcontext()
        torch_training.lazy_modules = contextlib.nullcontext


def _training_model(execution: str, model_name: str, batch: int, seq: int | None
                    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """As ``measured_model``, in training mode with the training step's libraries warmed."""
    import torch

    from tensorarena.bench.exec_executions import warm_libraries
    from tensorarena.planning.models import build_model

    torch.set_num_threads(1)
    warm_libraries(execution, training=True)
    model, (args, kwargs) = build_model(model_name, size="base", batch=batch, seq=seq)
    return model.train(), tuple(args), dict(kwargs)


def measure(variant: str, model_name: str, batch: int, seq: int | None,
            calls: int, training: bool = False) -> dict[str, int]:
    """One variant's figures, in this process (the child's side)."""
    import tensorarena
    from tensorarena.bench import process_memory
    from tensorarena.bench.exec_executions import build_execution, measured_model

    execution, savings = VARIANTS[variant]
    turn_off(savings)
    make = _training_model if training else measured_model
    model, args, kwargs = make(execution, model_name, batch=batch, seq=seq)
    gc.collect()
    baseline = process_memory.rss() or 0

    def peak_of(step: Any) -> int:
        gc.collect()
        process_memory.reset_peak()
        step()
        return max(process_memory.peak_rss() or 0, process_memory.rss() or 0) - baseline

    held: list[Any] = []
    result = {"build_peak": peak_of(lambda: held.append(build_execution(
        execution, model, args, kwargs, training=training)))}
    built = held.pop()
    result["built"] = (process_memory.rss() or 0) - baseline
    peaks = []
    for _ in range(calls):
        peaks.append(peak_of(built.call))
        built.drop()
    result.update(first_peak=peaks[0], steady_peak=peaks[-1])
    source = built.program.source if built.program is not None else ""
    del built
    gc.collect()
    tensorarena.empty_cache()
    result["after_del"] = (process_memory.rss() or 0) - baseline
    if source:  # last, as it leaves heap behind: what compiling the program's code here peaks at
        before = process_memory.rss() or 0
        result["source_chars"] = len(source)
        result["compile_peak"] = peak_of(lambda: compile(source, "<x>", "exec")) + baseline - before
    return result


def child_command(variant: str, options: argparse.Namespace) -> list[str]:
    """The command line of one measuring process."""
    command = [sys.executable, __file__, "--child", variant, "--model", options.model,
               "--batch", str(options.batch), "--calls", str(options.calls)]
    command += ["--training"] if options.training else []
    return command + (["--seq", str(options.seq)] if options.seq is not None else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=None, help="none for image models")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--training", action="store_true", help="a training step (train mode)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure(options.child, options.model, options.batch, options.seq,
                                 options.calls, options.training)))
        return 0
    if not sys.platform.startswith("linux"):
        print("skipped: this script reads /proc/self/status (Linux)")
        return 0
    rows: dict[str, list[dict[str, int]]] = {variant: [] for variant in VARIANTS}
    order = list(VARIANTS)
    for k in range(options.rounds):
        for variant in order[k % len(order):] + order[:k % len(order)]:
            done = subprocess.run(child_command(variant, options), capture_output=True,
                                  text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{done.stderr[-3000:]}")
            rows[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    shape = f"{options.batch}x{options.seq}" if options.seq is not None else str(options.batch)
    step = ", a training step" if options.training else ""
    print(f"{options.model} {shape} (base size{step}), one thread, medians of {options.rounds} "
          "fresh processes; MiB resident above the baseline")
    print(f"  {'variant':24s}" + "".join(f"{stage:>13s}" for stage in STAGES)
          + f"{'steady/eager':>14s}")
    eager = statistics.median(r["steady_peak"] for r in rows["eager"])
    for variant, results in rows.items():
        medians = [statistics.median(r[stage] for r in results) for stage in STAGES]
        ratio = medians[STAGES.index("steady_peak")] / eager if eager else float("nan")
        print(f"  {variant:24s}" + "".join(f"{m / MIB:13.1f}" for m in medians)
              + f"{ratio:14.2f}")
    compiled = [r for r in rows["planned"] if "compile_peak" in r]
    if compiled:
        chars = statistics.median(r["source_chars"] for r in compiled)
        peak = statistics.median(r["compile_peak"] for r in compiled)
        print(f"  compiling the planned program's code here: {chars:,.0f} characters, peak "
              f"+{peak / MIB:.1f} MiB resident ({peak / chars:.0f} bytes a character)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
