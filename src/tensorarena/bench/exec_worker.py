"""One measuring process of ``bench exec`` (``python -m tensorarena.bench.exec_worker JOB OUT``).

The parent (:mod:`tensorarena.bench.exec_subprocess`) writes a job as JSON and starts a fresh
Python for it, so each measurement sees a process that nothing else ran in. A job names one model
configuration and any of:

``memory``   one execution whose memory to measure. The *baseline* is the resident size once the
             libraries every execution of the run needs are imported (``preload``), the
             execution has run on a tiny model (what its library does once per process:
             ``library_rss``, reported apart) and the weights and inputs are built. Then the
             execution is built and called twice (planning or compiling, then a warm-up), and
             ``calls`` more times, each with the previous outputs dropped: ``rss_peak`` is the
             most resident during a call above the baseline (the planned arena included, held or
             not), ``rss_held`` what stays resident after it with its outputs kept,
             ``rss_held_dropped`` with them dropped, ``rss_held_released`` that after
             :func:`tensorarena.empty_cache` (a planned program's idle arena given back page by
             page, the program kept), ``rss_built`` before the first measured
             call; each the largest over the calls. Only then, as the profiler takes memory of
             its own, one profiled call: ``torch_peak``, the most torch's allocator held during
             it, and ``live_peak``, that plus the arena (``arena_bytes``). For ``planned`` also
             ``details``: the plan (:meth:`~tensorarena.runtime.PlannedProgram.report`), the
             allocator calls, the poisoned check (``verify``), a memory snapshot (``snapshot``:
             a pickle path). For another execution, ``trace`` (a path): one call recorded as
             our CSV trace. Last, in a job that times nothing after: ``rss_after_delete``,
             resident above the baseline once the execution is deleted and
             :func:`tensorarena.empty_cache` ran (what it leaves in the process for good).
``latency``  executions to time in this process after everything above: built, checked against
             eager's outputs (``max_abs_err``), warmed up, then called ``repeats`` rounds in
             rotating order; the median of each. An execution that fails to build or run is
             ``skipped`` with the reason and the others carry on.

The result goes to ``OUT`` as JSON; an error of the memory execution is its ``error``.
"""

from __future__ import annotations

import gc
import importlib
import json
import pickle
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensorarena.bench import process_memory
from tensorarena.bench.exec_executions import (
    Execution,
    build_execution,
    leaves,
    max_abs_err,
    warm_libraries,
)

__all__ = ["main", "run_job"]


def _reason(exc: BaseException) -> str:
    """One line for a failure: torch.compile's errors run to pages."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _output_bytes(out: Any) -> int:
    """The bytes of the output tensors themselves (an output planned in the arena is a view of
    it: its storage is the whole arena), each counted once."""
    return sum(size for _, size in {(t.data_ptr(), t.numel() * t.element_size())
                                    for t in leaves(out)})


def _measure_memory(execution: Execution, baseline: int, calls: int,
                    inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any]:
    from tensorarena.runtime import trace_allocations

    start = time.perf_counter()
    for _ in range(2):  # the first call plans or compiles what is left; the second warms up
        out = execution.call()
        del out
        execution.drop()
    seconds = time.perf_counter() - start
    gc.collect()
    result: dict[str, Any] = {"build_seconds": seconds,
                              "rss_built": (process_memory.rss() or 0) - baseline}
    peaks: list[int] = []
    kept: list[int] = []
    dropped: list[int] = []
    output_bytes = 0
    for _ in range(calls):
        gc.collect()
        reset = process_memory.reset_peak()
        out = execution.call()
        peak, now = process_memory.peak_rss(), process_memory.rss()
        output_bytes = _output_bytes(out)
        del out
        execution.drop()
        gc.collect()
        after = process_memory.rss()
        if reset and peak is not None and now is not None and after is not None:
            # VmHWM is read before VmRSS: a page that came in between belongs to the peak too
            peaks.append(max(peak, now, after) - baseline)
            kept.append(now - baseline)
            dropped.append(after - baseline)
    result.update(rss_peak=max(peaks, default=None), rss_held=max(kept, default=None),
                  rss_held_dropped=max(dropped, default=None), output_bytes=output_bytes,
                  calls=calls, rss_held_released=_rss_released(baseline))
    args, kwargs = inputs
    if execution.program is not None:  # annotated: allocations charged to node paths
        import torch

        torch.manual_seed(0)
        out, trace = execution.program.trace_allocations(*args, **kwargs)
    else:
        out, trace = trace_allocations(execution.call)
    del out
    execution.drop()
    result.update(torch_peak=trace.peak_bytes, arena_bytes=execution.arena_bytes,
                  live_peak=trace.peak_bytes + execution.arena_bytes,
                  allocations=trace.allocations)
    if execution.program is not None:
        result["planned_allocations"] = trace.planned_allocations
        result["scalar_allocations"] = trace.small_planned_allocations
    return result


def _rss_released(baseline: int) -> int | None:
    """Resident above ``baseline`` between calls once :func:`tensorarena.empty_cache` ran
    (the execution kept: a planned program gives its idle arena's pages back)."""
    from tensorarena.interop.empty_cache import empty_cache

    empty_cache()
    now = process_memory.rss()
    return None if now is None else now - baseline


def _record_call(execution: Execution, path: str) -> None:
    """One call's allocations, torch's and tensorarena's, as our CSV trace at ``path`` (the
    demo draws an eager call from it beside the planned call's snapshot)."""
    from tensorarena.trace import record_torch, write_csv

    with record_torch(name=execution.name, stack_depth=0) as recording:
        out = execution.call()
        del out
    write_csv(recording.trace, path)


def _rss_after_delete(baseline: int) -> int | None:
    """Resident above ``baseline`` once the caller dropped the execution and ran
    :func:`tensorarena.empty_cache`: what it leaves in the process for good."""
    from tensorarena.interop.empty_cache import empty_cache

    gc.collect()
    empty_cache()
    now = process_memory.rss()
    return None if now is None else now - baseline


def _details(execution: Execution, job: dict[str, Any],
             inputs: tuple[tuple[Any, ...], dict[str, Any]]) -> dict[str, Any]:
    """What the plan is (the runtime's report), checked with dead buffers poisoned if asked."""
    import torch

    program = execution.program
    report = program.report()
    details: dict[str, Any] = {
        "lower_bound": report.lower_bound, "planned_arena": report.planned_bytes,
        "naive": report.naive_bytes, "graph_lower_bound": report.graph_lower_bound,
        "paths": report.counts, "planner": report.planner, "outputs": program.outputs,
        "reordered": program.reordered, "kernel_arena": report.kernel_arena,
        "kernel": {"buffers": report.kernel_buffers, "bytes": report.kernel_bytes,
                   "served": report.kernel_served, "forwarded": report.kernel_forwarded,
                   "escaped": report.kernel_escaped},
        "tail_bytes": report.tail_bytes, "verified": False,
    }
    args, kwargs = inputs
    if job.get("verify"):
        torch.manual_seed(0)
        try:
            program.verify(*args, **kwargs)
            details["verified"] = True
        except Exception as exc:  # reported, not fatal: the numbers above still stand
            details["verify_error"] = _reason(exc)
    if job.get("snapshot"):
        torch.manual_seed(0)
        _, snapshot = program.record_memory(*args, **kwargs)
        with open(job["snapshot"], "wb") as file:
            pickle.dump(snapshot, file)
    return details


def _measure_latency(model: Any, inputs: tuple[tuple[Any, ...], dict[str, Any]],
                     job: dict[str, Any], ready: dict[str, Execution]) -> dict[str, Any]:
    """Time ``job["latency"]``'s executions, reusing those ``ready`` (built already)."""
    args, kwargs = inputs
    training = bool(job["config"]["training"])
    built: dict[str, Execution] = {}
    skipped: dict[str, str] = {}
    errors: dict[str, float] = {}
    reference: Any = None
    for name in job["latency"]:
        try:
            execution = ready.get(name) or build_execution(
                name, model, args, kwargs, training=training, options=job.get("options"))
            out = execution.call()
            if name == "eager":
                reference = out
            elif reference is not None:
                errors[name] = max_abs_err(out, reference)
            del out
            execution.call()  # warm-up
        except Exception as exc:  # one execution that fails here must not hide the others
            skipped[name] = _reason(exc)
            continue
        built[name] = execution
    del reference
    times: dict[str, list[float]] = {name: [] for name in built}
    order = list(built)
    for i in range(int(job.get("repeats", 5))):
        # Rotate who goes first so none always runs on caches another warmed.
        for name in order[i % len(order):] + order[:i % len(order)]:
            start = time.perf_counter()
            out = built[name].call()
            times[name].append(time.perf_counter() - start)
            del out
            built[name].drop()
    return {"ms": {name: statistics.median(t) * 1e3 for name, t in times.items() if t},
            "repeats": int(job.get("repeats", 5)), "max_abs_err": errors, "skipped": skipped}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job (module docstring) in this process; return its result."""
    import torch

    threads = job.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    for module in job.get("preload", ()):
        importlib.import_module(module)
    from tensorarena.planning.models import build_model

    config = job["config"]
    result: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    if job.get("memory"):
        before = process_memory.rss() or 0
        try:
            warm_libraries(job["memory"], training=config["training"], options=job.get("options"))
        except Exception as exc:  # then the model's build says so again, with its own reason
            result["library_error"] = _reason(exc)
        gc.collect()
        result["library_rss"] = (process_memory.rss() or 0) - before
    model, (args, kwargs) = build_model(config["model"], size=config["size"],
                                        batch=config["batch"], seq=config["seq"])
    model.train(config["training"])
    inputs = (tuple(args), dict(kwargs))
    ready: dict[str, Execution] = {}
    if job.get("memory"):
        gc.collect()
        baseline = process_memory.rss() or 0
        result["baseline_rss"] = baseline
        try:
            execution = build_execution(job["memory"], model, *inputs,
                                        training=config["training"], options=job.get("options"))
            result["memory"] = _measure_memory(execution, baseline, int(job.get("calls", 2)),
                                               inputs)
            if job.get("trace") and execution.program is None:
                _record_call(execution, job["trace"])
            if execution.program is not None:
                result["details"] = _details(execution, job, inputs)
            if job.get("latency"):
                ready[execution.name] = execution
            else:
                del execution
                result["memory"]["rss_after_delete"] = _rss_after_delete(baseline)
        except Exception as exc:
            result["memory"] = {"error": _reason(exc)}
    if job.get("latency"):
        result["latency"] = _measure_latency(model, inputs, job, ready)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``exec_worker JOB OUT``: run the job in ``JOB`` (JSON), write the result to ``OUT``."""
    job_path, out_path = list(sys.argv[1:] if argv is None else argv)
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    Path(out_path).write_text(json.dumps(run_job(job)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
