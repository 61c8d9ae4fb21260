"""``tensorarena bench replay``: every shipped trace on every strategy and baseline; replay speed.

Three parts, each printed as a table (or one JSON object with ``--json``):

* **configurations** — each shipped trace (:func:`tensorarena.trace.shipped_traces`: a GPT-2
  training step, Llama decoding with a growing KV cache, a BERT server) replayed on every
  strategy (a pool over VirtualMemory with the pool's default growth), ``pytorch_like`` and the
  system allocators that are installed: footprint at the peak and at the end, fragmentation at
  the peak, ns per operation (ours: the median of three runs after a first one that pays for
  one-time set-up such as TLSF's tables; the system allocators: one run in a child process,
  every page touched).
* **best** — :func:`tensorarena.trace.recommend` on each shipped trace (every strategy ×
  growth policy, ``fixed`` at its smallest arena, a ThreadCached front): the recommended
  configuration and its footprint. Target: within a tenth above peak live bytes on every trace.
* **speed** — events per second of ``best_fit`` over VirtualMemory on each shipped trace and on
  a synthetic steady-state trace held in memory (median of the repeats; target >= 300 000), and
  a synthetic trace of 10^6 events replayed from its file in a child process (target: under
  10 s, reading included), with the child's resident-set growth beside that of a 10^5-event
  file with the same live set (1000 blocks), on best_fit and on VirtualMemory alone: the replay
  holds only the live set (VirtualMemory alone stays flat); an ``Arena`` remembers the
  addresses of its last ``recent_frees`` frees (to name double frees; as many as it can hold
  blocks, at most ``RECENT_FREES``), a bounded record.

Times are wall-clock on whatever machine runs it (noisy on a shared one: repeats and medians);
the footprints are bookkeeping and exact. This is a benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensorarena._version import build
from tensorarena.core.registry import STRATEGIES
from tensorarena.errors import SystemAllocatorUnavailableError
from tensorarena.sizes import format_size
from tensorarena.trace import Trace, read_trace, shipped_traces
from tensorarena.trace.configs import BASELINES, configuration
from tensorarena.trace.recommend import recommend

__all__ = ["configure", "main", "run", "write_synthetic"]

THROUGHPUT_TARGET = 300_000
STREAM_EVENTS = 1_000_000
STREAM_TARGET_SECONDS = 10.0
FOOTPRINT_TARGET = 1.10


def write_synthetic(path: Path, events: int, *, live: int = 1000, seed: int = 0) -> None:
    """A steady-state trace: ``live`` blocks, then frees of random victims each followed by an
    allocation (sizes log-uniform from 256 B to 16 MiB, bent toward small), streamed to disk."""
    rng = random.Random(seed)
    ids: list[int] = []
    sizes: dict[int, int] = {}
    with path.open("w", encoding="utf-8") as handle:
        handle.write("op,id,size\n")
        lines: list[str] = []
        count = next_id = 0
        while count < events:
            if len(ids) >= live:
                victim = ids.pop(rng.randrange(len(ids)))
                lines.append(f"f,{victim},{sizes.pop(victim)}\n")
                count += 1
                if count == events:
                    break
            nbytes = int(256 * 2 ** (16 * rng.random() ** 2))
            ids.append(next_id)
            sizes[next_id] = nbytes
            lines.append(f"a,{next_id},{nbytes}\n")
            next_id += 1
            count += 1
            if len(lines) >= 65536:
                handle.writelines(lines)
                lines.clear()
        handle.writelines(lines)


def _configurations(traces: dict[str, Trace], quick: bool) -> dict[str, dict[str, Any]]:
    names = [*STRATEGIES, *BASELINES]
    table: dict[str, dict[str, Any]] = {}
    for trace_name, trace in traces.items():
        row: dict[str, Any] = {}
        for name in names:
            if quick and name in ("jemalloc", "mimalloc"):
                continue
            config = configuration(name)
            try:
                result = config.run(trace)
            except SystemAllocatorUnavailableError as why:
                row[name] = {"skipped": str(why)}
                continue
            if config.kind != "system":  # the first run paid for one-time set-up: time again
                runs = [config.run(trace) for _ in range(1 if quick else 3)]
                result = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
            row[name] = result.as_dict()
        table[trace_name] = {"peak_live": trace.summary().peak_live_bytes,
                             "events": len(trace), "results": row}
    return table


def _best(traces: dict[str, Trace], quick: bool) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for name, trace in traces.items():
        advice = recommend(trace, baselines=(),
                           strategies=("best_fit", "first_fit") if quick else None)
        if advice.best is None:
            best[name] = {"configuration": None}
            continue
        result = advice.best.result
        best[name] = {"configuration": advice.best.configuration.name,
                      "code": advice.best.configuration.code(),
                      "footprint_ratio": round(result.footprint_ratio or math.inf, 4),
                      "end_footprint_ratio": round(result.end_footprint_ratio or math.inf, 4),
                      "ns_per_op": round(result.ns_per_op, 1),
                      "meets_target": (result.footprint_ratio or math.inf) <= FOOTPRINT_TARGET}
    return best


def _throughput(trace: Trace, repeats: int) -> float:
    """Median events per second of best_fit over VirtualMemory (a warm-up run first)."""
    config = configuration("best_fit")
    config.run(trace)
    return statistics.median(config.run(trace).events_per_second for _ in range(repeats))


_CHILD = """
import json, sys, time
from tensorarena.memory import Pool, VirtualMemory
from tensorarena.trace import replay
def status(field):
    for line in open('/proc/self/status'):
        if line.startswith(field + ':'):
            return int(line.split()[1]) * 1024
if sys.argv[2] == 'pool':
    resource = Pool(VirtualMemory(), strategy='best_fit', initial_size=0, thread_safe=False)
else:
    resource = VirtualMemory()
open('/proc/self/clear_refs', 'w').write('5')
before = status('VmRSS')
began = time.perf_counter()
result = replay(sys.argv[1], resource)
seconds = time.perf_counter() - began
print(json.dumps({'seconds': seconds, 'events': result.events,
                  'rss_growth': status('VmHWM') - before,
                  'replay_events_per_second': result.events_per_second}))
"""


def _stream(events: int, folder: Path) -> dict[str, Any]:
    """Replay a synthetic file of ``events`` in a child, on best_fit and on VirtualMemory."""
    path = folder / f"stream-{events}.csv"
    write_synthetic(path, events)
    data: dict[str, Any] = {"file_bytes": os.path.getsize(path)}
    for kind in ("pool", "virtual"):
        done = subprocess.run([sys.executable, "-c", _CHILD, str(path), kind],
                              capture_output=True, text=True, check=True)
        data[kind] = json.loads(done.stdout)
    return data


def measure(*, quick: bool = False) -> dict[str, Any]:
    """Every part of the benchmark (see the module docstring), as JSON-ready data."""
    traces = {name: read_trace(path) for name, path in shipped_traces().items()}
    repeats = 3 if quick else 7
    document: dict[str, Any] = {
        "configurations": _configurations(traces, quick),
        "best": _best(traces, quick),
    }
    speed: dict[str, Any] = {name: round(_throughput(trace, repeats))
                             for name, trace in traces.items()}
    with tempfile.TemporaryDirectory(prefix="tensorarena-bench-replay-") as folder:
        steady = Path(folder) / "steady.csv"
        write_synthetic(steady, 20_000 if quick else 200_000)
        speed["synthetic_steady"] = round(_throughput(read_trace(steady), repeats))
        streams = {}
        if sys.platform.startswith("linux"):
            sizes = (20_000, 100_000) if quick else (100_000, STREAM_EVENTS)
            for events in sizes:
                streams[str(events)] = _stream(events, Path(folder))
    document["speed"] = {"best_fit_events_per_second": speed, "target": THROUGHPUT_TARGET,
                         "stream": streams, "stream_target_seconds": STREAM_TARGET_SECONDS}
    return document


def _print(document: dict[str, Any]) -> None:
    print(f"bench replay: {document['build']} build")
    for trace_name, entry in document["configurations"].items():
        print(f"\n{trace_name}: {entry['events']} events, peak live "
              f"{format_size(entry['peak_live'])}")
        print(f"  {'configuration':<16}{'footprint':>10}{'at end':>9}{'frag':>8}"
              f"{'ns/op':>11}")
        for name, row in entry["results"].items():
            if "skipped" in row:
                print(f"  {name:<16}skipped: {row['skipped']}")
                continue
            frag = "-" if row["fragmentation"] is None else f"{row['fragmentation']:.1%}"
            print(f"  {name:<16}{row['footprint_ratio']:>10.3f}{row['end_footprint_ratio']:>9.3f}"
                  f"{frag:>8}{row['ns_per_op']:>11,.0f}")
    print(f"\nbest configuration per trace (target: footprint <= {FOOTPRINT_TARGET}):")
    for name, row in document["best"].items():
        print(f"  {name:<14} {row['footprint_ratio']:.3f} at the peak, "
              f"{row['end_footprint_ratio']:.3f} at the end, {row['ns_per_op']:,.0f} ns/op: "
              f"{row['code']}")
    speed = document["speed"]
    print(f"\nbest_fit over VirtualMemory, events/s (median; target {THROUGHPUT_TARGET:,}):")
    for name, value in speed["best_fit_events_per_second"].items():
        print(f"  {name:<18} {value:>10,}")
    print("streamed from a file in a child process (two passes: the peak, then the replay); "
          "resident-set growth")
    for events, row in speed["stream"].items():
        pool, virtual = row["pool"], row["virtual"]
        print(f"  {int(events):>9,} events ({format_size(row['file_bytes'])}): best_fit "
              f"{pool['seconds']:.2f} s, +{format_size(pool['rss_growth'])}; VirtualMemory "
              f"alone {virtual['seconds']:.2f} s, +{format_size(virtual['rss_growth'])}")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true",
                        help="a short run (for tests): fewer repeats and strategies, small "
                             "streams, no jemalloc/mimalloc")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print the tables (or JSON); return the exit status."""
    began = time.perf_counter()
    document = measure(quick=args.quick)
    document["seconds"] = round(time.perf_counter() - began, 1)
    document["build"] = build()
    if args.json:
        print(json.dumps(document, indent=1))
    else:
        _print(document)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.replay [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
