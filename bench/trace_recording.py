"""What recording tensorarena's pools costs, and what per-block hover adds to the viz page.

1. A 4 KiB allocate+deallocate pair on ``Pool(HostMemory())``: not recording (one ``is None``
   test per call), recorded by a :class:`~tensorarena.trace.PoolRecording` without stacks, and
   with 8 frames of stack (interned, formatted once per distinct site).
2. The HTML page of a random trace of N events: bytes, and bytes per block, with the per-block
   hover data (every block, however the layout is drawn).

Not a test: it asserts nothing. Usage: python bench/trace_recording.py [EVENTS]
"""

from __future__ import annotations

import random
import sys
import tempfile
import timeit
from pathlib import Path

from tensorarena import HostMemory, Pool
from tensorarena.trace import Event, PoolRecording

PAIR = 4096


def _pair_us(pool: Pool, number: int = 20_000) -> float:
    def pair() -> None:
        pool.deallocate(pool.allocate(PAIR), PAIR)

    return min(timeit.repeat(pair, number=number, repeat=5)) / number * 1e6


def _events(count: int, seed: int = 3) -> list[Event]:
    rng = random.Random(seed)
    events: list[Event] = []
    live: list[tuple[int, int]] = []
    for step in range(count):
        if live and rng.random() < 0.48:
            ident, nbytes = live.pop(rng.randrange(len(live)))
            events.append(Event("f", ident, nbytes, 0, 10 * step))
        else:
            nbytes = rng.choice([64, 1000, 4096, 100_000, 1 << 20])
            events.append(Event("a", step, nbytes, 0, 10 * step))
            live.append((step, nbytes))
    return events


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 200_000
    pool = Pool(HostMemory(), initial_size="4MiB")
    plain = _pair_us(pool)
    with PoolRecording(stack_depth=0):
        bare = _pair_us(pool, number=5_000)
    with PoolRecording(stack_depth=8):
        stacked = _pair_us(pool, number=5_000)
    print(f"{PAIR} B allocate+deallocate pair on Pool(HostMemory()), µs (min of 5)")
    print(f"  not recording        {plain:8.2f}")
    print(f"  recorded, no stacks  {bare:8.2f}")
    print(f"  recorded, 8 frames   {stacked:8.2f}")

    from tensorarena.report import timeline_from_events
    from tensorarena.report.viz import write_html

    timeline = timeline_from_events(_events(count))
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "page.html"
        write_html(timeline, page)
        empty = Path(folder) / "empty.html"
        write_html(timeline_from_events([Event("a", 0, 64), Event("f", 0, 64)]), empty)
        size, base = page.stat().st_size, empty.stat().st_size
    print(f"viz page of {count:,} events ({timeline.blocks:,} blocks): {size / 1e6:.1f} MB, "
          f"{(size - base) / max(timeline.blocks, 1):.1f} bytes a block above a 1-block page "
          f"({base / 1e6:.1f} MB, plotly inlined)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
