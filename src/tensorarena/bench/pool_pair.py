"""``tensorarena bench pool-pair``: a pool's allocate+deallocate pair, one arena vs a fragmented
first arena, per strategy.

A pool tries its arenas in order. This prints the cost of a 64 KiB pair when the first arena is
fragmented (half its bytes free, no extent over 4 KiB) beside the same pair in a pool of one
arena, over ``VirtualMemory`` (bookkeeping only), and so also what the pool's lock costs a call.
A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import timeit

from tensorarena._version import build
from tensorarena.core import STRATEGIES
from tensorarena.memory import Pool, VirtualMemory

__all__ = ["PAIR", "configure", "measure", "run"]

#: The bytes of the pair timed.
PAIR = 64 << 10


def _pair_us(pool: Pool, number: int) -> float:
    def pair() -> None:
        pool.deallocate(pool.allocate(PAIR), PAIR)

    return min(timeit.repeat(pair, number=number, repeat=3)) / number * 1e6


def _fragmented(strategy: str) -> Pool:
    pool = Pool(VirtualMemory(), strategy=strategy, initial_size="1MiB")
    blocks = [pool.allocate(4096) for _ in range(256)]
    for address in blocks[::2]:
        pool.deallocate(address, 4096)
    pool.deallocate(pool.allocate(1 << 20), 1 << 20)  # grows a second arena
    return pool


def measure(number: int) -> dict[str, dict[str, float]]:
    """``{strategy: {"one_arena_us": ..., "fragmented_first_us": ...}}``, best of three runs
    of ``number`` pairs."""
    return {
        strategy: {
            "one_arena_us": _pair_us(Pool(VirtualMemory(), strategy=strategy,
                                          initial_size="4MiB"), number),
            "fragmented_first_us": _pair_us(_fragmented(strategy), number),
        }
        for strategy in STRATEGIES
    }


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument("--number", type=int, default=20_000, help="pairs per timed run")


def run(args: argparse.Namespace) -> int:
    """Time every strategy and print the table (or one JSON object); return 0."""
    results = measure(200 if args.quick else args.number)
    if args.json:
        print(json.dumps({"build": build(), "pair_bytes": PAIR, "strategies": results}))
        return 0
    print(f"{PAIR >> 10} KiB allocate+deallocate pair through Pool(VirtualMemory()), µs, "
          f"{build()} build")
    print(f"{'strategy':<16} {'one arena':>10} {'fragmented first':>17}")
    for strategy, row in results.items():
        print(f"{strategy:<16} {row['one_arena_us']:>10.2f} {row['fragmented_first_us']:>17.2f}")
    return 0
