"""``tensorarena bench adaptors``: what each debugging adaptor costs per allocate+deallocate pair.

One thread runs the same seeded workload through a pool alone and through the pool wrapped in
each adaptor: small mixed sizes (64 B to 16 KiB), a window of 32 live blocks, and per operation
one deallocate (the oldest block) and one allocate. The pool is ``Pool(HostMemory())`` with a
first arena large enough that it never grows while timed, so its pages are faulted in during the
warm-up and the timed figure is bookkeeping plus whatever the adaptor writes and reads.

The figure is nanoseconds per pair (the best of ``--repeats`` timed runs, each after a warm-up
pass) and the overhead over the bare pool, in nanoseconds and as a ratio. The adaptors do very
different work, so the numbers say what turning one on costs, not which is "faster":

* ``Counting``: counters under a lock (the reference: the cheapest useful adaptor);
* ``Tracking`` without and with stacks (8 frames);
* ``Guarded``: two red zones written on allocate and read on free (64 bytes each);
* ``Guarded`` with guard pages: two ``mprotect`` system calls per pair, a page or two more each;
* ``Poisoning``: a ``memset`` of the freed block, read back when it leaves the quarantine.

This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable, Sequence

from tensorarena._version import build
from tensorarena.adaptors import Counting, Guarded, Poisoning, Tracking
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource

__all__ = ["STACKS", "configure", "main", "measure", "run"]

SIZES = (64, 128, 256, 512, 1024, 4096, 16384)
WINDOW = 32

#: name → how to wrap the pool. "pool" is the baseline every overhead is measured against.
STACKS: dict[str, Callable[[Pool], MemoryResource]] = {
    "pool": lambda pool: pool,
    "counting": Counting,
    "tracking": Tracking,
    "tracking_stacks8": lambda pool: Tracking(pool, stack_depth=8),
    "guarded": lambda pool: Guarded(pool, stack_depth=0),
    "guarded_sites": Guarded,
    "guarded_pages": lambda pool: Guarded(pool, guard_pages=True, stack_depth=0),
    "poisoning": lambda pool: Poisoning(pool, stack_depth=0),
    "poisoning_sites": Poisoning,
}

_LABELS = {
    "pool": "Pool(HostMemory()) alone",
    "counting": "Counting",
    "tracking": "Tracking (no stacks)",
    "tracking_stacks8": "Tracking(stack_depth=8)",
    "guarded": "Guarded (no sites)",
    "guarded_sites": "Guarded (default: 1-frame sites)",
    "guarded_pages": "Guarded(guard_pages=True)",
    "poisoning": "Poisoning (no sites)",
    "poisoning_sites": "Poisoning (default: 1-frame sites)",
}


def _workload(seed: int, operations: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice(SIZES) for _ in range(operations)]


def _time_once(resource: MemoryResource, sizes: list[int]) -> float:
    """Seconds for len(sizes) deallocate+allocate pairs over a window of live blocks."""
    allocate, deallocate = resource.allocate, resource.deallocate
    window: list[tuple[int, int]] = [(allocate(n), n) for n in sizes[:WINDOW]]
    head = 0
    start = time.perf_counter()
    for nbytes in sizes:
        address, size = window[head]
        deallocate(address, size)
        window[head] = (allocate(nbytes), nbytes)
        head = head + 1 if head + 1 < WINDOW else 0
    elapsed = time.perf_counter() - start
    for address, size in window:
        deallocate(address, size)
    return elapsed


def measure(
    stacks: Sequence[str] = tuple(STACKS),
    *,
    operations: int = 20_000,
    repeats: int = 5,
    strategy: str = "best_fit",
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """``{stack: {"ns_per_pair": ..., "overhead_ns": ..., "ratio": ...}}`` (the baseline
    "pool" is always measured, first). Runs alternate between stacks within each repeat, so a
    slow spell of a shared machine hits them all alike."""
    names = ["pool", *(name for name in stacks if name != "pool")]
    sizes = _workload(seed, operations)
    best = dict.fromkeys(names, float("inf"))
    resources: dict[str, tuple[Pool, MemoryResource]] = {}
    for name in names:
        pool = Pool(HostMemory(), strategy=strategy, initial_size="64MiB")
        resources[name] = (pool, STACKS[name](pool))
        _time_once(resources[name][1], sizes[: max(WINDOW, operations // 10)])  # warm-up
    for _ in range(repeats):
        for name in names:
            best[name] = min(best[name], _time_once(resources[name][1], sizes))
    for _, resource in resources.values():
        flush = getattr(resource, "flush", None)
        if callable(flush):
            flush()
    base = best["pool"] / operations * 1e9
    results: dict[str, dict[str, float]] = {}
    for name in names:
        ns = best[name] / operations * 1e9
        results[name] = {"ns_per_pair": ns, "overhead_ns": ns - base, "ratio": ns / base}
    return results


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument("--ops", type=int, default=None, help="pairs per run (default 20000)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs, best kept")
    parser.add_argument("--strategy", default="best_fit", help="the pool's placement strategy")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument(
        "--stacks",
        default=",".join(STACKS),
        help=f"comma-separated adaptor stacks to time (default all: {','.join(STACKS)})",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    stacks = [name.strip() for name in str(args.stacks).split(",") if name.strip()]
    unknown = [name for name in stacks if name not in STACKS]
    if unknown or not stacks:
        print(f"--stacks: unknown {unknown or 'empty list'}; choose from {', '.join(STACKS)}")
        return 2
    operations = args.ops or (500 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 5)
    results = measure(
        stacks, operations=operations, repeats=repeats, strategy=args.strategy, seed=args.seed
    )
    if args.json:
        document = {
            "build": build(),
            "stacks": results,
            "operations": operations,
            "repeats": repeats,
            "strategy": args.strategy,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }
        print(json.dumps(document, indent=2))
        return 0
    print(
        f"ns per deallocate+allocate pair, {operations} pairs, best of {repeats}, "
        f"Pool(HostMemory(), {args.strategy}), window {WINDOW}, sizes 64 B-16 KiB; "
        f"{build()} build"
    )
    print(f"{'stack':<36} {'ns/pair':>9} {'overhead':>9} {'ratio':>6}")
    for name, row in results.items():
        print(
            f"{_LABELS[name]:<36} {row['ns_per_pair']:>9,.0f} {row['overhead_ns']:>+9,.0f} "
            f"{row['ratio']:>5.2f}x"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.adaptors [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench adaptors", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
