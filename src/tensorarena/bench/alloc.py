"""``tensorarena bench alloc``: allocate/free latency, footprint and fragmentation per strategy.

One fixed, seeded workload shaped like a model's intermediates — sizes from 256 B to 64 MiB,
log-distributed and skewed toward small, about 500 blocks live, frees of random victims — is
driven through an :class:`~tensorarena.core.Arena` with each strategy:

* ``ns_per_pair``: time of the steady phase (after the first fill) per allocate+deallocate pair,
  through the arena's public methods, the median of several repeats. The repeats go round-robin
  over the strategies so that a burst of load elsewhere on the machine hits them alike, and time
  is the process's CPU time (``time.process_time_ns``), which on a quiet machine equals wall time
  for this single-threaded loop and on a shared one leaves out the time spent descheduled. It
  includes the loop that replays the workload (about one Python call's worth per operation).
* ``footprint_ratio``: the high-water mark of ``offset + nbytes`` over the peak of live bytes;
  1.0 would be a perfect packing, a buddy system pays its power-of-two rounding here.
* ``fragmentation``: ``1 - largest_free / free`` at the end of the workload, ~500 blocks live.

The same run times a bare Python function call and a ctypes ``malloc``+``free`` pair of libc, so
numbers from a noisy or slow machine can be read as ratios. This is a benchmark, not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import textwrap
import timeit
from collections.abc import Sequence
from dataclasses import dataclass
from time import process_time_ns
from typing import ClassVar

from tensorarena._version import build
from tensorarena.core import STRATEGIES, Arena
from tensorarena.errors import OutOfMemoryError

__all__ = [
    "StrategyResult",
    "Workload",
    "arena_floor_ns",
    "configure",
    "libc_pair_ns",
    "make_workload",
    "measure",
    "python_call_ns",
    "replay_loop_ns",
    "run",
]

MIN_SIZE = 256
MAX_SIZE = 64 << 20
TARGET_LIVE = 500

#: What the table's columns mean: printed under the table and at the end of ``--help``.
LEGEND = (
    "ns/pair: CPU time per allocate+deallocate pair in the timed phase (median of the repeats); "
    "x libc: ns/pair over one libc malloc+free pair called through ctypes; "
    "x call: ns/pair over one empty Python function call; "
    "footprint: highest offset+size reached over the peak of requested bytes live (1.0 = tight); "
    "frag: fragmentation at the end, 1 - largest free extent / free bytes (0 = one free extent)."
)


@dataclass(frozen=True)
class Workload:
    """A replayable sequence of operations: ``(slot, nbytes)`` allocates, ``(slot, 0)`` frees."""

    fill: list[tuple[int, int]]  #: the first fill up to the target number of live blocks
    steady: list[tuple[int, int]]  #: mixed allocations and frees, timed
    slots: int  #: number of distinct slots (the most blocks ever live at once)
    peak_live_bytes: int  #: the most requested bytes live at once

    @property
    def capacity(self) -> int:
        """An arena size that every strategy can serve the workload from (four times the peak,
        rounded up to a power of two)."""
        return 1 << (4 * self.peak_live_bytes - 1).bit_length()


@dataclass(frozen=True)
class StrategyResult:
    """What ``bench alloc`` measures for one strategy."""

    ns_per_pair: float
    footprint_ratio: float
    fragmentation: float


def _draw_size(rng: random.Random) -> int:
    # Log-uniform in [256 B, 64 MiB] bent toward small sizes by squaring the uniform draw: the
    # median request is ~20 KiB, about 6 % are 16 MiB or more.
    span = MAX_SIZE.bit_length() - MIN_SIZE.bit_length()
    return int(MIN_SIZE * 2.0 ** (span * rng.random() ** 2))


def make_workload(steady_ops: int, *, seed: int = 0, target_live: int = TARGET_LIVE) -> Workload:
    """The seeded workload: a fill to ``target_live`` blocks, then ``steady_ops`` operations."""
    rng = random.Random(seed)
    free_slots: list[int] = []
    live: list[tuple[int, int]] = []  # (slot, nbytes)
    slots = 0
    live_bytes = peak = 0

    def allocate(ops: list[tuple[int, int]]) -> None:
        nonlocal slots, live_bytes, peak
        if free_slots:
            slot = free_slots.pop()
        else:
            slot = slots
            slots += 1
        nbytes = _draw_size(rng)
        ops.append((slot, nbytes))
        live.append((slot, nbytes))
        live_bytes += nbytes
        peak = max(peak, live_bytes)

    fill: list[tuple[int, int]] = []
    for _ in range(target_live):
        allocate(fill)
    steady: list[tuple[int, int]] = []
    for _ in range(steady_ops):
        # Mean-reverting around the target, so runs of allocations and of frees both occur.
        p_alloc = 0.5 + (target_live - len(live)) / (4 * target_live)
        if len(live) < 2 or rng.random() < p_alloc:
            allocate(steady)
        else:
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            slot, nbytes = live.pop()
            free_slots.append(slot)
            live_bytes -= nbytes
            steady.append((slot, 0))
    return Workload(fill=fill, steady=steady, slots=slots, peak_live_bytes=peak)


def _replay(arena: Arena, ops: list[tuple[int, int]], addresses: list[int]) -> None:
    allocate = arena.allocate
    deallocate = arena.deallocate
    for slot, nbytes in ops:
        if nbytes:
            addresses[slot] = allocate(nbytes)
        else:
            deallocate(addresses[slot])


def _time_once(strategy: str, workload: Workload) -> float:
    """Nanoseconds per allocate+deallocate pair over the steady phase, on a fresh arena."""
    # Never in debug mode (TENSORARENA_DEBUG): the invariant checks would be what is timed.
    arena = Arena(workload.capacity, strategy, debug=False)
    addresses = [0] * workload.slots
    _replay(arena, workload.fill, addresses)
    steady = workload.steady
    start = process_time_ns()
    _replay(arena, steady, addresses)
    elapsed = process_time_ns() - start
    return 2 * elapsed / len(steady)


def _footprint(strategy: str, workload: Workload) -> tuple[float, float]:
    """(footprint_ratio, final fragmentation) from one untimed, instrumented replay."""
    arena = Arena(workload.capacity, strategy)
    addresses = [0] * workload.slots
    high_water = 0
    for slot, nbytes in (*workload.fill, *workload.steady):
        if nbytes:
            address = arena.allocate(nbytes)
            addresses[slot] = address
            high_water = max(high_water, address - arena.base + nbytes)
        else:
            arena.deallocate(addresses[slot])
    stats = arena.statistics()
    return high_water / stats.requested_bytes.peak, stats.fragmentation


def measure(
    strategies: Sequence[str], workload: Workload, *, repeats: int = 5
) -> dict[str, StrategyResult | None]:
    """Run the workload through each strategy: median of ``repeats`` timings (taken round-robin)
    plus footprint and fragmentation; ``None`` for a strategy that ran out of memory."""
    results: dict[str, StrategyResult | None] = {}
    shapes: dict[str, tuple[float, float]] = {}
    for name in strategies:
        try:
            shapes[name] = _footprint(name, workload)
        except OutOfMemoryError:
            results[name] = None  # cannot happen at 4x the peak, but never hide it if it does
    times: dict[str, list[float]] = {name: [] for name in shapes}
    for _ in range(repeats):
        for name in shapes:
            times[name].append(_time_once(name, workload))
    for name in strategies:
        if name in shapes:
            results[name] = StrategyResult(statistics.median(times[name]), *shapes[name])
    return results


class _NoArena:
    """Stands in for an arena to time the replay loop alone: calls that do nothing."""

    def allocate(self, nbytes: int) -> int:
        return nbytes

    def deallocate(self, address: int) -> None:
        pass


def replay_loop_ns(workload: Workload, *, repeats: int = 5) -> float:
    """Nanoseconds per pair that the replay loop itself costs (two empty method calls)."""
    times = []
    for _ in range(repeats):
        addresses = [0] * workload.slots
        start = process_time_ns()
        _replay(_NoArena(), workload.steady, addresses)  # type: ignore[arg-type]
        times.append(2 * (process_time_ns() - start) / len(workload.steady))
    return min(times)


class _ReplayedOffsets:
    """A placement strategy that hands out offsets recorded from a real one, doing nothing else:
    an arena over it costs what the arena itself costs."""

    name: ClassVar[str] = "replayed"
    coalesces: ClassVar[bool] = False

    def __init__(self, offsets: list[int], capacity: int) -> None:
        self.capacity = capacity
        self._next = iter(offsets).__next__

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        # Through a local: ``self._next()`` would be a method lookup CPython 3.11 does not
        # specialise for an instance attribute, and the floor would count it as the arena's.
        next_offset = self._next
        return next_offset()

    def release(self, offset: int, nbytes: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def free_bytes(self) -> int:
        return self.capacity

    def largest_free(self) -> int:
        return self.capacity

    def free_extent_count(self) -> int:
        return 1

    def free_extents(self) -> list[tuple[int, int]]:
        return [(0, self.capacity)]


def arena_floor_ns(workload: Workload, *, repeats: int = 5) -> float:
    """Nanoseconds per pair of the arena alone: ``Arena`` over a strategy that only replays the
    offsets best fit chose, so the strategy's share is (almost) nothing."""
    arena = Arena(workload.capacity, "best_fit")
    addresses = [0] * workload.slots
    offsets: list[int] = []
    for slot, nbytes in (*workload.fill, *workload.steady):
        if nbytes:
            addresses[slot] = arena.allocate(nbytes)
            offsets.append(addresses[slot])
        else:
            arena.deallocate(addresses[slot])
    times = []
    for _ in range(repeats):
        # debug=False: the replayed strategy keeps no accounts for the invariants to check.
        replayed = Arena(
            workload.capacity, lambda capacity: _ReplayedOffsets(offsets, capacity), debug=False
        )
        addresses = [0] * workload.slots
        _replay(replayed, workload.fill, addresses)
        start = process_time_ns()
        _replay(replayed, workload.steady, addresses)
        times.append(2 * (process_time_ns() - start) / len(workload.steady))
    return min(times)


def python_call_ns() -> float:
    """Cost of calling an empty Python function, in nanoseconds (best of 5)."""

    def nothing() -> None:
        pass

    number = 200_000
    timer = timeit.Timer(nothing, timer=_process_seconds)
    return min(timer.repeat(number=number, repeat=5)) / number * 1e9


def libc_pair_ns() -> float | None:
    """Cost of ``free(malloc(256))`` through ctypes, in nanoseconds; ``None`` without a libc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        malloc = libc.malloc
        free = libc.free
    except (OSError, AttributeError):
        return None
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free.restype = None
    free.argtypes = [ctypes.c_void_p]

    def pair() -> None:
        free(malloc(256))

    number = 100_000
    timer = timeit.Timer(pair, timer=_process_seconds)
    return min(timer.repeat(number=number, repeat=5)) / number * 1e9


def _process_seconds() -> float:
    return process_time_ns() / 1e9


# --- command line ------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.epilog = f"columns: {LEGEND}"
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument("--ops", type=int, default=None, help="steady-phase operations")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (median)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated strategy names (default: all, in table order)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    names = [name.strip() for name in args.strategies.split(",") if name.strip()]
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        print(f"unknown strategies: {', '.join(unknown)}; known: {', '.join(STRATEGIES)}")
        return 2
    ops = args.ops if args.ops is not None else (4_000 if args.quick else 60_000)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 5)
    workload = make_workload(ops, seed=args.seed)
    results = measure(names, workload, repeats=repeats)
    call_ns = python_call_ns()
    libc_ns = libc_pair_ns()
    if args.json:
        print(json.dumps(_as_json(results, call_ns, libc_ns)))
    else:
        _print_table(workload, results, call_ns, libc_ns, repeats)
        loop_ns = replay_loop_ns(workload, repeats=repeats)
        floor_ns = arena_floor_ns(workload, repeats=repeats)
        print(
            f"per pair, the replay loop alone (two empty calls): {loop_ns:.0f} ns; the loop "
            f"through Arena over a strategy that does no work: {floor_ns:.0f} ns"
        )
    return 0 if all(result is not None for result in results.values()) else 1


def _as_json(
    results: dict[str, StrategyResult | None], call_ns: float, libc_ns: float | None
) -> dict[str, object]:
    strategies: dict[str, object] = {}
    for name, result in results.items():
        strategies[name] = None if result is None else {
            "ns_per_pair": round(result.ns_per_pair, 1),
            "footprint_ratio": round(result.footprint_ratio, 4),
            "fragmentation": round(result.fragmentation, 4),
        }
    return {
        "build": build(),
        "strategies": strategies,
        "python_call_ns": round(call_ns, 1),
        "libc_pair_ns": None if libc_ns is None else round(libc_ns, 1),
    }


def _print_table(
    workload: Workload,
    results: dict[str, StrategyResult | None],
    call_ns: float,
    libc_ns: float | None,
    repeats: int,
) -> None:
    print(
        f"bench alloc: {len(workload.fill)} blocks filled, then {len(workload.steady)} mixed "
        f"operations (sizes 256 B - 64 MiB, ~{TARGET_LIVE} live); median of {repeats} repeats; "
        f"{build()} build"
    )
    header = (
        f"{'strategy':<16}{'ns/pair':>10}{'x libc':>9}{'x call':>9}{'footprint':>11}{'frag':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, result in results.items():
        if result is None:
            print(f"{name:<16}{'out of memory':>47}")
            continue
        vs_libc = f"{result.ns_per_pair / libc_ns:.1f}" if libc_ns else "-"
        print(
            f"{name:<16}{result.ns_per_pair:>10.0f}{vs_libc:>9}"
            f"{result.ns_per_pair / call_ns:>9.0f}{result.footprint_ratio:>11.3f}"
            f"{result.fragmentation:>8.3f}"
        )
    print(textwrap.fill(LEGEND, width=100, subsequent_indent="  "))
    libc_text = f"{libc_ns:.0f} ns" if libc_ns is not None else "unavailable"
    print(f"python call: {call_ns:.0f} ns; libc malloc+free pair via ctypes: {libc_text}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.alloc [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench alloc", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
