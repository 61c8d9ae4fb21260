"""What a planned program holds between calls, before and after ``tensorarena.empty_cache()``.

A program keeps its arena between calls (its code is generated over those addresses);
``empty_cache()`` gives the pages of an idle program's arena (and of output blocks no caller
holds) back to the system, keeping the addresses, and the next call faults them in again. In
one process per execution (as ``bench/process_floor.py``: libraries warmed on a tiny model
first, then the full-size model and its inputs, then the baseline), this prints the resident
memory above the baseline after warm calls with their outputs dropped, the same after
``empty_cache()``, and the median time of a call after a release beside a warm call's
(``--rounds`` of each, interleaved). Eager's process is measured the same way.

    .venv/bin/python bench/idle_release.py [--model gpt2] [--seq 128] [--rounds 5]

Linux only (``/proc/self/status``); elsewhere it says so and exits.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from typing import Any

MIB = 1 << 20


def _resident() -> int:
    from tensorarena.bench.process_memory import rss

    return rss() or 0


def measure(execution: str, model_name: str, batch: int, seq: int, rounds: int) -> dict[str, Any]:
    """One execution's figures, in this process (the child's side)."""
    import tensorarena
    from tensorarena.bench.exec_executions import build_execution, measured_model

    model, args, kwargs = measured_model(execution, model_name, batch=batch, seq=seq)
    gc.collect()
    baseline = _resident()
    built = build_execution(execution, model, args, kwargs, training=False)
    for _ in range(3):
        built.call()
        built.drop()
    gc.collect()
    held = _resident() - baseline
    tensorarena.empty_cache()
    released = _resident() - baseline
    warm, cold = [], []
    for _ in range(rounds):
        for times, release in ((warm, False), (cold, True)):
            if release:
                tensorarena.empty_cache()
            started = time.perf_counter()
            built.call()
            times.append(time.perf_counter() - started)
            built.drop()
    return {"execution": execution, "held": held, "after_empty_cache": released,
            "warm_ms": 1e3 * statistics.median(warm), "after_release_ms":
            1e3 * statistics.median(cold)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure(options.child, options.model, options.batch, options.seq,
                                 options.rounds)))
        return 0
    if not sys.platform.startswith("linux"):
        print("skipped: this script reads /proc/self/status (Linux)")
        return 0
    print(f"{options.model} {options.batch}x{options.seq} (base size), one thread; MiB resident "
          "above the baseline between calls, outputs dropped")
    for execution in ("eager", "planned"):
        command = [sys.executable, __file__, "--child", execution, "--model", options.model,
                   "--batch", str(options.batch), "--seq", str(options.seq),
                   "--rounds", str(options.rounds)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{execution} failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {execution:8s} held {row['held'] / MIB:6.1f}, after empty_cache() "
              f"{row['after_empty_cache'] / MIB:6.1f}; call {row['warm_ms']:7.1f} ms warm, "
              f"{row['after_release_ms']:7.1f} ms after a release")
    return 0


if __name__ == "__main__":
    sys.exit(main())
