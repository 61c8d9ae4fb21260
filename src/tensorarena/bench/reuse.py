"""``tensorarena bench reuse``: pooled arrays vs ``np.empty`` — what page-fault reuse buys.

Each timed iteration allocates an array, first-touches it (writes one byte per 4 KiB page, the
least a real kernel does to memory it fills) and frees it, for a given size, through
``np.empty`` and through ``tensorarena.empty`` (the default resource: thread-cached, thread-safe
pool over mmap with transparent huge pages), side by side in one run:

* ``np.empty`` of a large array is an ``mmap`` from glibc, a page fault plus a zeroed page per
  page touched, and an ``munmap`` on free; every iteration pays it again.
* the pool keeps its arena mapped and its pages resident, so after the first iteration the same
  bytes come back with no system call and no fault: the cost is the Python bookkeeping.

For each size: warm-up iterations (untimed), then ``repeats`` batches, each the mean over
``iterations`` (alloc, touch, free); the number reported is the median batch, in microseconds,
and ``speedup = numpy_us / tensorarena_us``. ``--json`` prints ``{"numpy_us", "tensorarena_us",
"speedup"}`` for 64 MiB at top level plus the same three keys per size under ``"sizes"``.

A benchmark, not a test: it asserts nothing. On a shared machine expect noise of ±20 % or more.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from time import perf_counter

import numpy as np

__all__ = ["SIZES", "configure", "main", "measure", "run"]

PAGE = 4096

#: name → bytes, in the order printed.
SIZES: dict[str, int] = {
    "64KiB": 64 << 10,
    "1MiB": 1 << 20,
    "16MiB": 16 << 20,
    "64MiB": 64 << 20,
}

# (iterations per batch, batches): enough for a stable median, scaled by size.
_PLAN_FULL = {64 << 10: (4000, 7), 1 << 20: (1000, 7), 16 << 20: (60, 7), 64 << 20: (20, 7)}
_PLAN_QUICK = {64 << 10: (200, 3), 1 << 20: (50, 3), 16 << 20: (4, 3), 64 << 20: (3, 3)}


def _numpy_cycle(nbytes: int) -> None:
    array = np.empty(nbytes, np.uint8)
    array[::PAGE] = 1
    del array


def _tensorarena_cycle(empty: Callable[..., np.ndarray]) -> Callable[[int], None]:
    def cycle(nbytes: int) -> None:
        array = empty(nbytes, np.uint8)
        array[::PAGE] = 1
        del array

    return cycle


def _time(cycle: Callable[[int], None], nbytes: int, iterations: int, batches: int) -> float:
    """Median over ``batches`` of the mean microseconds per cycle."""
    for _ in range(max(2, iterations // 10)):
        cycle(nbytes)  # warm-up: the pool maps and faults its arena here, glibc tunes itself
    means = []
    for _ in range(batches):
        start = perf_counter()
        for _ in range(iterations):
            cycle(nbytes)
        means.append((perf_counter() - start) / iterations * 1e6)
    return statistics.median(means)


def measure(sizes: Sequence[int], *, quick: bool = False) -> dict[int, dict[str, float]]:
    """``{nbytes: {"numpy_us", "tensorarena_us", "speedup"}}`` for each size."""
    from tensorarena.interop import default_resource, empty

    default_resource()  # create it outside the timings
    tensorarena_cycle = _tensorarena_cycle(empty)
    plan = _PLAN_QUICK if quick else _PLAN_FULL
    results: dict[int, dict[str, float]] = {}
    for nbytes in sizes:
        iterations, batches = plan.get(nbytes, (10, 3))
        numpy_us = _time(_numpy_cycle, nbytes, iterations, batches)
        tensorarena_us = _time(tensorarena_cycle, nbytes, iterations, batches)
        results[nbytes] = {
            "numpy_us": round(numpy_us, 3),
            "tensorarena_us": round(tensorarena_us, 3),
            "speedup": round(numpy_us / tensorarena_us, 3),
        }
    return results


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    results = measure(list(SIZES.values()), quick=args.quick)
    by_name = {name: results[nbytes] for name, nbytes in SIZES.items()}
    if args.json:
        document: dict[str, object] = dict(by_name["64MiB"])
        document["sizes"] = by_name
        print(json.dumps(document, indent=2))
        return 0
    print("alloc + first touch (1 byte / 4 KiB page) + free, median of batch means")
    print(f"{'size':>8}  {'np.empty µs':>12}  {'tensorarena µs':>15}  {'speedup':>8}")
    for name, row in by_name.items():
        print(
            f"{name:>8}  {row['numpy_us']:>12.2f}  {row['tensorarena_us']:>15.2f}  "
            f"{row['speedup']:>7.2f}x"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.reuse [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench reuse", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
