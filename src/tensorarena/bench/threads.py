"""``tensorarena bench threads``: allocation throughput across threads, lock vs thread caches.

Each of N threads (1, 2, 4, 8) runs the same seeded workload: small mixed sizes (64 B to 16 KiB),
a window of 32 live blocks, and one allocate + one deallocate per operation (allocate a new block,
free the oldest). Two stacks are compared over the same kind of pool:

* ``thread_safe_ops``: ``ThreadSafe(Pool(upstream))`` — every call takes the one lock and runs
  the pool's placement strategy.
* ``thread_cached_ops``: ``ThreadCached(ThreadSafe(Pool(upstream)))`` — a freed block goes into
  the freeing thread's cache and the next request of that shape takes it back without the lock.

The figure is allocate+deallocate pairs per second over all threads (wall time from a common
start barrier to the last thread's end, the best of ``--repeats`` runs). The pool's upstream is
:class:`~tensorarena.memory.host.HostMemory` (real mmap'd memory) where it is available, else
:class:`~tensorarena.memory.virtual.VirtualMemory`; its first arena is large enough that the
pool never grows while timed. Under CPython's GIL, threads do not run Python code in parallel,
so more threads cannot mean more throughput here; what the numbers show is what the lock and the
pool's bookkeeping cost per pair, and how much of it the thread caches avoid. This is a
benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import threading
import time
from collections.abc import Callable, Sequence

from tensorarena._version import build as active_build
from tensorarena.adaptors import ThreadCached, ThreadSafe
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource

__all__ = ["configure", "main", "measure", "run"]

SIZES = (64, 128, 256, 512, 1024, 4096, 16384)
WINDOW = 32
DEFAULT_THREADS = (1, 2, 4, 8)


def _upstream() -> tuple[MemoryResource, str]:
    try:
        from tensorarena.memory.host import HostMemory

        return HostMemory(), "HostMemory"
    except (ImportError, OSError):
        from tensorarena.memory.virtual import VirtualMemory

        return VirtualMemory(), "VirtualMemory"


def _pool(strategy: str) -> Pool:
    upstream, _ = _upstream()
    # Room for every thread's window at the largest size, so the timed phase never grows.
    return Pool(upstream, strategy=strategy, initial_size="64MiB")


STACKS: dict[str, Callable[[Pool], MemoryResource]] = {
    "thread_safe": ThreadSafe,
    "thread_cached": lambda pool: ThreadCached(ThreadSafe(pool)),
}


def _workload(seed: int, operations: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice(SIZES) for _ in range(operations)]


def _time_once(resource: MemoryResource, threads: int, operations: int, seed: int) -> float:
    """Seconds for ``threads`` threads to each run ``operations`` allocate+deallocate pairs."""
    workloads = [_workload(seed * 100 + i, operations) for i in range(threads)]
    barrier = threading.Barrier(threads + 1)
    failures: list[BaseException] = []

    def worker(sizes: list[int]) -> None:
        allocate, deallocate = resource.allocate, resource.deallocate
        window: list[tuple[int, int]] = [(allocate(n), n) for n in sizes[:WINDOW]]
        head = 0
        try:
            barrier.wait()
            for nbytes in sizes:
                address, size = window[head]
                deallocate(address, size)
                window[head] = (allocate(nbytes), nbytes)
                head = head + 1 if head + 1 < WINDOW else 0
        except BaseException as exc:  # surfaced after join, not swallowed in the thread
            failures.append(exc)
        finally:
            for address, size in window:
                deallocate(address, size)

    workers = [threading.Thread(target=worker, args=(w,)) for w in workloads]
    for thread in workers:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in workers:
        thread.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise failures[0]
    return elapsed


def measure(
    threads: Sequence[int] = DEFAULT_THREADS,
    *,
    operations: int = 20_000,
    repeats: int = 3,
    strategy: str = "first_fit",
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Pairs per second for each stack and thread count: ``{"1": {"thread_safe_ops": ...}}``."""
    results: dict[str, dict[str, float]] = {}
    for count in threads:
        row: dict[str, float] = {}
        for name, build in STACKS.items():
            best = float("inf")
            hit_rate = 0.0
            for _ in range(repeats):
                pool = _pool(strategy)
                resource = build(pool)
                best = min(best, _time_once(resource, count, operations, seed))
                if isinstance(resource, ThreadCached):
                    hit_rate = resource.statistics().hit_rate
                    resource.flush_all()
                pool.close()
            row[f"{name}_ops"] = count * operations / best
            if name == "thread_cached":
                row["thread_cached_hit_rate"] = hit_rate
        row["speedup"] = row["thread_cached_ops"] / row["thread_safe_ops"]
        results[str(count)] = row
    return results


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument(
        "--threads",
        default=",".join(map(str, DEFAULT_THREADS)),
        help="comma-separated thread counts (default 1,2,4,8)",
    )
    parser.add_argument("--ops", type=int, default=None, help="pairs per thread (default 20000)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs, best kept")
    parser.add_argument("--strategy", default="first_fit", help="the pool's placement strategy")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    try:
        threads = [int(t) for t in str(args.threads).split(",") if t.strip()]
    except ValueError:
        print(f"--threads must be comma-separated integers, got {args.threads!r}")
        return 2
    if not threads or min(threads) < 1:
        print("--threads needs at least one positive count")
        return 2
    operations = args.ops or (500 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 3)
    results = measure(
        threads, operations=operations, repeats=repeats, strategy=args.strategy, seed=args.seed
    )
    document = {
        "build": active_build(),
        "threads": results,
        "operations_per_thread": operations,
        "repeats": repeats,
        "strategy": args.strategy,
        "upstream": _upstream()[1],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(
        f"allocate+deallocate pairs per second, {operations} per thread, best of {repeats}, "
        f"Pool({document['upstream']}, {args.strategy}), {os.cpu_count()} CPUs; "
        f"{document['build']} build"
    )
    print(f"{'threads':>7}  {'ThreadSafe':>12}  {'ThreadCached':>12}  {'speedup':>7}  {'hits':>5}")
    for count, row in results.items():
        print(
            f"{count:>7}  {row['thread_safe_ops']:>12,.0f}  {row['thread_cached_ops']:>12,.0f}  "
            f"{row['speedup']:>6.2f}x  {row['thread_cached_hit_rate']:>5.0%}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.threads [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench threads", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
