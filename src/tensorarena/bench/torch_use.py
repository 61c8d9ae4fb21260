"""``tensorarena bench torch-use``: what one allocation costs under ``tensorarena.torch.use``.

For a few sizes, ``torch.empty(n, dtype=torch.uint8)`` is made and dropped in a loop (an allocation
and a free per iteration) with torch's own CPU allocator, then under routes to three resources: one
that does almost nothing (one slot, handed out and taken back: ``route-slot``, the price of the
route itself: one Python call to ``allocate`` and one to ``deallocate`` per tensor, with the GIL
held, see :mod:`tensorarena.torch.route`); the default resource (``route-default``: a thread cache
over a pool, what ``use()`` takes when given none); a plain ``Pool(HostMemory())``, best fit
(``route-pool``); ``tensorarena.torch.learned()`` with each batch a step (``learned-native``: a
step that repeats its plan is served in C++ with no Python call; ``learned-python``: the same with
``native=False``, a call to the plans per allocation), the step marker timed with the batch (it
books what was served natively); a :class:`~tensorarena.torch.NativePool`, one arena kept in C++
(``native-pool``: the route takes and frees each block in C++, no Python call;
``native-pool-call``: the same pool behind a pass-through adaptor, so the route calls its
``allocate``/``deallocate`` from Python as it would any resource's). Each configuration's loop is
timed in batches; the median batch's ns per iteration (CPU time) is printed, with the overhead over
torch's. Configurations take turns batch by batch, so a burst of load elsewhere on the machine hits
them alike, and time is the thread's CPU time (``time.thread_time_ns``: the loop is
single-threaded, and on a shared machine this leaves out the time spent descheduled). A benchmark,
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tensorarena._version import build

__all__ = ["configure", "main", "measure", "run"]

SIZES = (64, 4096, 1 << 20)
CONFIGS = ("torch", "route-slot", "route-default", "route-pool", "learned-native",
           "learned-python", "native-pool", "native-pool-call")
#: Steps each learned configuration runs before it is timed (recorded, then planned again).
LEARNED_WARM_STEPS = 3


class _OneSlot:
    """One block of host memory, handed out while free: the cheapest resource there is (the
    loop frees each tensor before it makes the next)."""

    def __init__(self, upstream: Any, nbytes: int) -> None:
        self.memory_kind = upstream.memory_kind
        self._address = upstream.allocate(nbytes, 4096)
        self._nbytes = nbytes
        self._free = True

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        if not self._free or nbytes > self._nbytes:
            from tensorarena.errors import OutOfMemoryError

            raise OutOfMemoryError(nbytes, free=0, largest_free=0, capacity=self._nbytes)
        self._free = False
        return int(self._address)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self._free = True


class _PassThrough:
    """Calls ``upstream`` from Python: a route to it pays the Python call per allocation."""

    def __init__(self, upstream: Any) -> None:
        self.memory_kind = upstream.memory_kind
        self.allocate, self.deallocate = upstream.allocate, upstream.deallocate


def _loop(torch: Any, nbytes: int, iterations: int) -> int:
    empty, uint8 = torch.empty, torch.uint8
    start = time.thread_time_ns()
    for _ in range(iterations):
        empty(nbytes, dtype=uint8)
    return time.thread_time_ns() - start


class _LearnedBatches:
    """A ``learned()`` route whose every batch is one step; installed while a batch runs."""

    def __init__(self, native: bool) -> None:
        from tensorarena.torch import LearnedSteps

        self.steps = LearnedSteps(native=native)
        self.steps.install()
        self.steps.route.uninstall()

    def loop(self, torch: Any, nbytes: int, iterations: int) -> int:
        route = self.steps.route
        route.install()
        start = time.thread_time_ns()
        _loop(torch, nbytes, iterations)
        self.steps.step()  # books what the route served natively: part of the price
        elapsed = time.thread_time_ns() - start
        route.uninstall()
        return elapsed

    def close(self) -> None:
        self.steps.close()


def measure(sizes: Sequence[int] = SIZES, *, iterations: int = 2000, batches: int = 15
            ) -> dict[str, dict[int, float]]:
    """Median ns per make-and-drop of a tensor of each size, per configuration."""
    import torch

    from tensorarena.interop import default_resource
    from tensorarena.memory import HostMemory, Pool
    from tensorarena.torch import NativePool, use

    pool = Pool(HostMemory(), strategy="best_fit")
    slot = _OneSlot(HostMemory(), max(sizes))
    native = NativePool(size=16 * max(sizes) + (1 << 20), native=True)
    called = _PassThrough(native)
    routes: dict[str, Callable[[], Any]] = {
        "torch": lambda: None, "route-slot": lambda: use(slot), "route-pool": lambda: use(pool),
        "route-default": lambda: use(default_resource()), "native-pool": lambda: use(native),
        "native-pool-call": lambda: use(called)}
    samples: dict[str, dict[int, list[float]]] = {c: {n: [] for n in sizes} for c in CONFIGS}
    for nbytes in sizes:
        learned = {"learned-native": _LearnedBatches(True),
                   "learned-python": _LearnedBatches(False)}
        for config in CONFIGS:  # warm up: the shim built, the pools grown, the steps planned
            if config in learned:
                for _ in range(LEARNED_WARM_STEPS):
                    learned[config].loop(torch, nbytes, iterations)
                continue
            route = routes[config]()
            _loop(torch, nbytes, 200)
            if route is not None:
                route.uninstall()
        for _ in range(batches):
            for config in CONFIGS:
                if config in learned:
                    elapsed = learned[config].loop(torch, nbytes, iterations)
                else:
                    route = routes[config]()
                    elapsed = _loop(torch, nbytes, iterations)
                    if route is not None:
                        route.uninstall()
                samples[config][nbytes].append(elapsed / iterations)
        for batches_of in learned.values():
            batches_of.close()
    return {c: {n: statistics.median(v) for n, v in by_size.items()}
            for c, by_size in samples.items()}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="tensors made and dropped per batch (default 2000)")
    parser.add_argument("--batches", type=int, default=None, help="timed batches (default 15)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    from tensorarena.interop import torch_cpu_shim

    reason = torch_cpu_shim.unavailable()
    if reason:
        print(f"torch's CPU allocator shim cannot be built here: {reason}")
        return 1
    iterations = args.iterations or (200 if args.quick else 2000)
    batches = args.batches or (3 if args.quick else 15)
    results = measure(iterations=iterations, batches=batches)
    if args.json:
        print(json.dumps({"build": build(), "iterations": iterations, "batches": batches,
                          "ns_per_tensor": {c: {str(n): round(v, 1) for n, v in r.items()}
                                            for c, r in results.items()}}, indent=2))
        return 0
    print(f"{'bytes':>9}  " + "  ".join(f"{c:>16}" for c in CONFIGS)
          + "  slot - torch  default - torch  learned-native - torch  native-pool - torch")
    for nbytes in SIZES:
        cells = "  ".join(f"{results[c][nbytes]:>13.0f} ns" for c in CONFIGS)
        slot = results["route-slot"][nbytes] - results["torch"][nbytes]
        default = results["route-default"][nbytes] - results["torch"][nbytes]
        learned = results["learned-native"][nbytes] - results["torch"][nbytes]
        native = results["native-pool"][nbytes] - results["torch"][nbytes]
        print(f"{nbytes:>9}  {cells}  {slot:>9.0f} ns  {default:>12.0f} ns  {learned:>19.0f} ns"
              f"  {native:>16.0f} ns")
    print(f"median of {batches} batches of {iterations} torch.empty + drop per configuration")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.torch_use [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench torch-use", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
