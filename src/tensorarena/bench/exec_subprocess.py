"""``bench exec``'s measurements, each in a fresh Python process (the parent's side).

Process memory is only comparable between processes that ran nothing else: an eager call after a
planned one finds glibc's heap already grown, Inductor's code loaded, the arena held. So each
execution of each configuration gets its own process (:mod:`tensorarena.bench.exec_worker`, which
says what it measures), and one more process times them all, interleaved, once the memory
processes have said which ones work. An execution that fails, crashes or runs past ``timeout``
is reported as skipped with the reason, and the rest carry on.

Resident memory is not the same from one process to the next, even with the same hash seed:
glibc's heap keeps what torch frees, in a layout that varies (GPT-2 124M eager at 1x128 held
from 37.9 to 56.0 MiB in five identical processes). ``processes`` measures each execution
in that many processes and keeps the median of each resident number, with every run's in
``rss_runs``; the live peak, torch's own count, does not vary.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tensorarena.bench.exec_configs import Config

__all__ = ["Progress", "RunOptions", "make_job", "measure_config", "ratios", "run_job"]

#: What each execution's process imports before its baseline (module docstring of exec_worker).
_PRELOAD = ("transformers", "tensorarena.runtime", "torch.export")
_PRELOAD_COMPILE = ("torch._dynamo", "torch._inductor.compile_fx")
#: The numbers compared with eager's, as ratios.
RATIO_KEYS = ("live_peak", "rss_peak", "rss_held", "rss_held_dropped", "rss_held_released",
              "rss_after_delete", "ms")
#: The resident numbers, which vary between processes (module docstring).
RSS_KEYS = ("rss_built", "rss_peak", "rss_held", "rss_held_dropped", "rss_held_released",
            "rss_after_delete")


class Progress:
    """A line per step on ``stream`` as it starts and one with its time when it ends."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.stream is not None:
            print(f"  {label} ...", file=self.stream, flush=True)
        yield
        if self.stream is not None:
            print(f"    done in {time.perf_counter() - start:.1f} s", file=self.stream, flush=True)


@dataclass(frozen=True)
class RunOptions:
    """What every process of a run shares: the ``executions`` to compare, timed ``repeats``,
    measured memory ``calls``, torch ``threads`` (None: torch's default), the planned
    program's ``options``, the ``timeout`` of one process in seconds, and how many
    ``processes`` measure each execution's memory (the median counts)."""

    executions: tuple[str, ...] = ("eager", "planned", "compiled")
    repeats: int = 5
    calls: int = 2
    threads: int | None = 1
    options: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0
    processes: int = 1


def make_job(config: Config, run: RunOptions, *, memory: str | None = None,
             latency: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A job for :func:`run_job` (keys: see :mod:`tensorarena.bench.exec_worker`)."""
    preload = _PRELOAD + (_PRELOAD_COMPILE if "compiled" in run.executions else ())
    return {"config": config.as_dict(), "memory": memory, "latency": list(latency),
            "preload": list(preload), "threads": run.threads, "options": run.options,
            "calls": run.calls, "repeats": run.repeats, **extra}


def _environment(threads: int | None) -> dict[str, str]:
    import tensorarena

    env = dict(os.environ)
    # The child imports this very tensorarena, whatever put it on the parent's path.
    source = str(Path(tensorarena.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    if threads is not None:  # OpenMP in Inductor's kernels too; no pool of compile workers
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   TORCHINDUCTOR_COMPILE_THREADS="1")
    return env


def run_job(job: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """Run ``job`` in a fresh Python; its result, or ``{"error": why}`` if the process failed,
    crashed or ran past ``timeout`` seconds (then it is killed)."""
    with tempfile.TemporaryDirectory(prefix="tensorarena-exec-") as folder:
        job_path, out_path = Path(folder) / "job.json", Path(folder) / "result.json"
        job_path.write_text(json.dumps(job), encoding="utf-8")
        command = [sys.executable, "-m", "tensorarena.bench.exec_worker", str(job_path),
                   str(out_path)]
        try:
            done = subprocess.run(command, env=_environment(job.get("threads")), timeout=timeout,
                                  capture_output=True, text=True, check=False)
        except subprocess.TimeoutExpired:
            return {"error": f"ran past the timeout of {timeout:g} s"}
        if done.returncode != 0 or not out_path.exists():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            last = lines[-1][:300] if lines else "no message"
            return {"error": f"the process exited with status {done.returncode}: {last}"}
        result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
        return result


def ratios(executions: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``{"planned/eager": {key: ratio}, "compiled/eager": ...}`` for :data:`RATIO_KEYS`
    (None where either number is missing or eager's is not positive)."""
    eager = executions.get("eager", {})
    out: dict[str, dict[str, float | None]] = {}
    for name, numbers in executions.items():
        if name == "eager":
            continue
        out[f"{name}/eager"] = {
            key: (numbers[key] / eager[key]
                  if numbers.get(key) is not None and eager.get(key) else None)
            for key in RATIO_KEYS
        }
    return out


def _median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One execution's numbers from its processes: the first's, with each resident number the
    median of all (``rss_runs``: every process's, when there are several)."""
    numbers = {**runs[0]["memory"], "library_rss": runs[0].get("library_rss"),
               "baseline_rss": runs[0].get("baseline_rss")}
    if len(runs) > 1:
        numbers["rss_runs"] = {key: [r["memory"].get(key) for r in runs] for key in RSS_KEYS}
        for key, values in numbers["rss_runs"].items():
            known = [v for v in values if v is not None]
            numbers[key] = int(statistics.median(known)) if known else None
    return numbers


def measure_config(config: Config, run: RunOptions, progress: Progress) -> dict[str, Any]:
    """Every execution of ``config`` in its own process, then their latency in one more:
    ``{"config", "executions": {name: numbers}, "ratios", "planned", "max_abs_err",
    "skipped": {name: why}}``."""
    executions: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    result: dict[str, Any] = {"config": config.as_dict()}
    for name in run.executions:
        if name == "exported" and config.training:
            skipped[name] = "inference only"
            continue
        runs: list[dict[str, Any]] = []
        for i in range(max(1, run.processes)):
            count = f" ({i + 1} of {run.processes})" if run.processes > 1 else ""
            with progress.step(f"{name}: memory, in a fresh process{count}"):
                done = run_job(make_job(config, run, memory=name), timeout=run.timeout)
            why = done.get("error") or done.get("memory", {}).get("error")
            if why:
                skipped[name] = why
                if progress.stream is not None:
                    print(f"    skipped: {why}", file=progress.stream)
                break
            runs.append(done)
            if "details" in done:
                result["planned"] = done["details"]
        if name not in skipped:
            executions[name] = _median_of(runs)
    working = tuple(name for name in run.executions if name in executions)
    if working:
        with progress.step(f"latency: {', '.join(working)} interleaved, {run.repeats} rounds"):
            done = run_job(make_job(config, run, latency=working), timeout=run.timeout)
        if "error" in done:
            result["latency_error"] = done["error"]
        else:
            for name, ms in done["latency"]["ms"].items():
                executions[name]["ms"] = ms
            result["max_abs_err"] = done["latency"]["max_abs_err"]
            skipped.update({f"{name} latency": why
                            for name, why in done["latency"]["skipped"].items()})
    result.update(executions=executions, ratios=ratios(executions), skipped=skipped)
    return result
