"""Pool allocate+deallocate pair, one arena vs a fragmented first arena, per strategy.

A pool tries its arenas in order. This prints the cost of a 64 KiB pair when the first arena is
fragmented (half its bytes free, no extent over 4 KiB) beside the same pair in a pool of one
arena, over ``VirtualMemory`` (bookkeeping only). Not a test: it asserts nothing.
Usage: python bench/pool_pair.py
"""

from __future__ import annotations

import sys
import timeit

from tensorarena import Pool, VirtualMemory
from tensorarena.core import STRATEGIES

PAIR = 64 << 10


def _pair_us(pool: Pool, number: int = 20_000) -> float:
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


def main() -> int:
    print(f"{PAIR >> 10} KiB allocate+deallocate pair through Pool(VirtualMemory()), µs")
    print(f"{'strategy':<16} {'one arena':>10} {'fragmented first':>17}")
    for strategy in STRATEGIES:
        one = _pair_us(Pool(VirtualMemory(), strategy=strategy, initial_size="4MiB"))
        fragmented = _pair_us(_fragmented(strategy))
        print(f"{strategy:<16} {one:>10.2f} {fragmented:>17.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
