"""Replay real models' allocation sequences on our GPU pool and on PyTorch's caching allocator.

The traces are the buffers of the model zoo's graphs (``tensorarena.planning.models``: every
intermediate with its lifetime, from ``torch.export`` for inference and ``make_fx`` for
training), turned into the allocate/free sequence a runtime without a plan would issue (at each
step the buffers that die are freed, then the new ones allocated). The same sequence runs:

- ``ta_pool``  on ``Pool(CudaMemory())`` with the settings of ``device_pool()`` (best fit,
  doubling arenas): what it reserves from CUDA at its peak, and µs per operation;
- ``torch``    as ``torch.empty(n, uint8, device="cuda")`` and ``del``: PyTorch's caching
  allocator, ``torch.cuda.max_memory_reserved`` over the run, and µs per operation;

beside ``lower_bound`` (the peak of live bytes: no allocator can reserve less) and
``planned`` (the static plan's arena, for scale). Reserved/lower bound is each allocator's
overhead for this workload: fragmentation and rounding. (When the trace module of issue 10
ships recorded traces, they replay through the same two functions.)
Usage: python bench/gpu_replay.py [--json] [--models gpt2,llama] [--size base]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from gpu_common import MiB, emit, gpu_torch, machine

Event = tuple[bool, int, int]  # (allocate?, buffer index, nbytes)


def events_of(problem: Any) -> list[Event]:
    """The allocate/free sequence of a planning problem's buffers (frees first at each step)."""
    points: list[tuple[int, int, int, int]] = []
    for index, buffer in enumerate(problem.buffers):
        if buffer.nbytes:
            points.append((buffer.start, 1, index, buffer.nbytes))
            points.append((buffer.end, 0, index, buffer.nbytes))
    points.sort()
    return [(kind == 1, index, nbytes) for _, kind, index, nbytes in points]


def replay_pool(events: list[Event]) -> dict[str, float]:
    from tensorarena.memory import Doubling, Pool
    from tensorarena.memory.cuda import CudaMemory

    pool = Pool(CudaMemory(), strategy="best_fit", initial_size="2MiB", growth=Doubling("1GiB"))
    live: dict[int, int] = {}
    began = time.perf_counter()
    for allocate, index, nbytes in events:
        if allocate:
            live[index] = pool.allocate(nbytes)
        else:
            pool.deallocate(live.pop(index), nbytes)
    seconds = time.perf_counter() - began
    stats = pool.statistics()
    pool.close()
    return {"reserved_peak": stats.reserved_bytes.peak, "us_per_op": seconds / len(events) * 1e6}


def replay_torch(torch: Any, events: list[Event]) -> dict[str, float]:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    live: dict[int, Any] = {}
    began = time.perf_counter()
    for allocate, index, nbytes in events:
        if allocate:
            live[index] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        else:
            del live[index]
    seconds = time.perf_counter() - began
    reserved = torch.cuda.max_memory_reserved() - base
    live.clear()
    torch.cuda.empty_cache()
    return {"reserved_peak": reserved, "us_per_op": seconds / len(events) * 1e6}


def run(torch: Any, names: list[str], size: str, modes: list[str],
        progress: Any = None) -> list[dict[str, Any]]:
    """One row per model and mode; ``progress(rows)`` is called after each (so a run cut short
    by a timeout still leaves the rows it finished)."""
    from tensorarena.planning import plan
    from tensorarena.planning.models import model_problem

    rows: list[dict[str, Any]] = []
    for name in names:
        for mode in modes:
            row: dict[str, Any] = {"model": name, "mode": mode}
            try:
                problem = model_problem(name, size=size, training=mode == "training").problem
                events = events_of(problem)
                row.update(
                    buffers=len(problem), events=len(events),
                    lower_bound=problem.lower_bound(), planned=plan(problem, "portfolio").height,
                    ta_pool=replay_pool(events), torch=replay_torch(torch, events),
                )
            except Exception as exc:  # one model failing must not hide the others
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(f"{name} {mode} done", file=sys.stderr, flush=True)
            if progress is not None:
                progress(rows)
    return rows


def _table(record: dict[str, Any]) -> None:
    print(f"replayed allocation sequences on {record['machine']['device']} "
          f"({record['size']} configs), MiB reserved at peak; µs per operation")
    print(f"{'model':<8} {'mode':<10} {'events':>7} {'LB':>8} {'plan':>8} {'ta_pool':>8} "
          f"{'torch':>8} {'ta µs':>7} {'torch µs':>8}")
    for r in record["rows"]:
        if "error" in r:
            print(f"{r['model']:<8} {r['mode']:<10} error: {r['error']}")
            continue
        print(f"{r['model']:<8} {r['mode']:<10} {r['events']:>7} {r['lower_bound'] / MiB:>8.1f} "
              f"{r['planned'] / MiB:>8.1f} {r['ta_pool']['reserved_peak'] / MiB:>8.1f} "
              f"{r['torch']['reserved_peak'] / MiB:>8.1f} {r['ta_pool']['us_per_op']:>7.2f} "
              f"{r['torch']['us_per_op']:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama,vit")
    parser.add_argument("--size", default="base", choices=("tiny", "base"))
    parser.add_argument("--modes", default="inference,training")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch = gpu_torch()
    if torch is None:
        return 0
    record: dict[str, Any] = {"machine": machine(torch), "size": args.size, "rows": []}

    def progress(rows: list[dict[str, Any]]) -> None:  # --json: one cumulative line per row
        record["rows"] = rows
        if args.json:
            emit(record, as_json=True, table=_table)

    run(torch, args.models.split(","), args.size, args.modes.split(","), progress)
    if not args.json:
        emit(record, as_json=False, table=_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
