"""``tensorarena bench thread-cache``: ThreadCached's hit path, ns per allocate+deallocate pair
served by the calling thread's cache.

The resource is the one ``tensorarena.empty`` uses (``interop.default_resource()``: a
``ThreadCached`` over a pool of host memory), warmed so that every allocate is a cache hit and
every deallocate a put. Cases:

* ``one shape``: a 64 KiB pair, again and again (what ``bench reuse`` does per array);
* ``three shapes``: 64 KiB, 4 KiB and 256 B allocated, then freed, in turn (the bucket changes at
  every call, so the last-used-bucket shortcut never applies);
* ``two threads``: the one-shape pair on two threads at once (the figure is per pair, both
  threads' pairs counted; the threads take the last-used cache from each other at every switch).

Best and median of ``--repeats`` timed runs. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable

from tensorarena._version import build
from tensorarena.interop import default_resource

__all__ = ["CASES", "configure", "measure", "run"]

SHAPES = ((64 << 10, 256), (4 << 10, 256), (256, 256))


def _one_shape(number: int) -> float:
    resource = default_resource()
    allocate, deallocate = resource.allocate, resource.deallocate
    nbytes = 64 << 10
    start = time.perf_counter()
    for _ in range(number):
        deallocate(allocate(nbytes, 256), nbytes)
    return time.perf_counter() - start


def _three_shapes(number: int) -> float:
    resource = default_resource()
    allocate, deallocate = resource.allocate, resource.deallocate
    (a, aa), (b, ba), (c, ca) = SHAPES
    start = time.perf_counter()
    for _ in range(number // 3):
        x, y, z = allocate(a, aa), allocate(b, ba), allocate(c, ca)
        deallocate(x, a)
        deallocate(y, b)
        deallocate(z, c)
    return time.perf_counter() - start


def _two_threads(number: int) -> float:
    threads = [threading.Thread(target=_one_shape, args=(number // 2,)) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


#: case name -> the function timing ``number`` pairs of it, in seconds
CASES: dict[str, Callable[[int], float]] = {
    "one shape": _one_shape, "three shapes": _three_shapes, "two threads": _two_threads,
}


def measure(repeats: int, number: int) -> dict[str, dict[str, float]]:
    """``{case: {"best_ns": ..., "median_ns": ...}}``, ns per pair over ``repeats`` runs of
    ``number`` pairs."""
    _one_shape(1000)
    _three_shapes(3000)  # every shape cached once: the timed runs only hit
    results = {}
    for name, case in CASES.items():
        runs = [case(number) / number * 1e9 for _ in range(repeats)]
        results[name] = {"best_ns": min(runs), "median_ns": statistics.median(runs)}
    return results


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs (default 7)")
    parser.add_argument("--number", type=int, default=100_000, help="pairs per timed run")


def run(args: argparse.Namespace) -> int:
    """Time every case and print the table (or one JSON object); return 0."""
    results = measure(1 if args.quick else args.repeats, 600 if args.quick else args.number)
    if args.json:
        print(json.dumps({"build": build(), "results": results}))
        return 0
    print(f"ThreadCached hit pair (default resource), ns per pair, {build()} build")
    for name, result in results.items():
        print(f"{name:<14} best {result['best_ns']:7.0f}   median {result['median_ns']:7.0f}")
    return 0
