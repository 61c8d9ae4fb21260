"""``tensorarena bench reuse``: pooled arrays vs ``np.empty`` — what page-fault reuse buys.

Each timed iteration allocates an array, first-touches it (writes one byte per 4 KiB page, the
least a real kernel does to memory it fills) and frees it, for a given size, through
``np.empty`` and through ``tensorarena.empty`` (the default resource: thread-cached, thread-safe
pool over mmap with transparent huge pages), side by side in one run:

* ``np.empty`` of a large array is an ``mmap`` from glibc, a page fault plus a zeroed page per
  page touched, and an ``munmap`` on free; every iteration pays it again.
* the pool keeps its arena mapped and its pages resident, so after the first iteration the same
  bytes come back with no system call and no fault: the cost is the Python bookkeeping.

For each size: warm-up iterations (untimed), then ``repeats`` batches of each side, each the
mean over ``iterations`` (alloc, touch, free) in the thread's CPU time (time the process spends
descheduled on a shared machine is not counted); the two sides' batches alternate (ABBA), so a
change of load hits both alike. The number reported is the median batch, in microseconds, and
``speedup = numpy_us / tensorarena_us``. ``--json`` prints ``{"numpy_us", "tensorarena_us",
"speedup"}`` for 64 MiB at top level plus the same three keys per size under ``"sizes"``.

Where torch is installed, the same cycle is also timed for tensors (the ``torch`` section of
``--json``, ``None`` without torch): ``torch.empty`` (CPU, ``uint8``) against
``tensorarena.empty(..., like="torch")``, each touching one byte per page, at the same sizes:
``{"torch_us", "tensorarena_us", "speedup"}`` per size, ``speedup = torch_us / tensorarena_us``.

``--owners`` also times the ways an array can own foreign memory (the measurements behind
:mod:`tensorarena.interop.owner`; the native owner only where it is built) and splits a 64 KiB
``tensorarena.empty`` into its pieces: the default resource's allocate+deallocate pair, ``empty``
over a resource that does nothing, and the whole cycle, for arrays and (with torch) tensors —
where the time goes when NumPy's or torch's heap is faster than a pool in Python.

A benchmark, not a test: it asserts nothing. On a shared machine expect noticeable noise: compare
runs made together.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from time import perf_counter, thread_time_ns
from typing import Any

import numpy as np

from tensorarena._version import build
from tensorarena.memory_kind import MemoryKind

__all__ = [
    "SIZES",
    "TORCH_SIZES",
    "configure",
    "main",
    "measure",
    "measure_owners",
    "measure_torch",
    "run",
]

PAGE = 4096

#: name → bytes, in the order printed.
SIZES: dict[str, int] = {
    "64KiB": 64 << 10,
    "1MiB": 1 << 20,
    "16MiB": 16 << 20,
    "64MiB": 64 << 20,
}

#: The sizes of the torch comparison (name → bytes).
TORCH_SIZES: dict[str, int] = dict(SIZES)

# (iterations per batch, batches): enough for a stable median, scaled by size.
_PLAN_FULL = {64 << 10: (1500, 15), 1 << 20: (400, 15), 16 << 20: (30, 11), 64 << 20: (10, 11)}
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


def _batch_us(cycle: Callable[[int], None], nbytes: int, iterations: int) -> float:
    """The mean microseconds of thread CPU time per cycle over one batch."""
    start = thread_time_ns()
    for _ in range(iterations):
        cycle(nbytes)
    return (thread_time_ns() - start) / iterations / 1e3


def _time_pair(
    first: Callable[[int], None],
    second: Callable[[int], None],
    nbytes: int,
    iterations: int,
    batches: int,
) -> tuple[float, float]:
    """The median batch of each cycle, in µs, their batches alternating (ABBA)."""
    for cycle in (first, second):
        for _ in range(max(2, iterations // 10)):
            cycle(nbytes)  # warm-up: the pool maps and faults its arena here, glibc tunes itself
    means: tuple[list[float], list[float]] = ([], [])
    for batch in range(batches):
        for side in (0, 1) if batch % 2 == 0 else (1, 0):
            means[side].append(_batch_us((first, second)[side], nbytes, iterations))
    return statistics.median(means[0]), statistics.median(means[1])


def measure(sizes: Sequence[int], *, quick: bool = False) -> dict[int, dict[str, float]]:
    """``{nbytes: {"numpy_us", "tensorarena_us", "speedup"}}`` for each size."""
    from tensorarena.interop import default_resource, empty

    default_resource()  # create it outside the timings
    tensorarena_cycle = _tensorarena_cycle(empty)
    plan = _PLAN_QUICK if quick else _PLAN_FULL
    results: dict[int, dict[str, float]] = {}
    for nbytes in sizes:
        iterations, batches = plan.get(nbytes, (10, 3))
        numpy_us, tensorarena_us = _time_pair(
            _numpy_cycle, tensorarena_cycle, nbytes, iterations, batches
        )
        results[nbytes] = {
            "numpy_us": round(numpy_us, 3),
            "tensorarena_us": round(tensorarena_us, 3),
            "speedup": round(numpy_us / tensorarena_us, 3),
        }
    return results


def measure_torch(
    sizes: Sequence[int], *, quick: bool = False
) -> dict[int, dict[str, float]] | None:
    """``{nbytes: {"torch_us", "tensorarena_us", "speedup"}}``, or ``None`` without torch."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    from tensorarena.interop import default_resource, empty

    default_resource()

    def torch_cycle(nbytes: int) -> None:
        tensor = torch.empty(nbytes, dtype=torch.uint8)
        tensor[::PAGE] = 1
        del tensor

    def tensorarena_cycle(nbytes: int) -> None:
        tensor = empty(nbytes, np.uint8, like="torch")
        tensor[::PAGE] = 1
        del tensor

    plan = _PLAN_QUICK if quick else _PLAN_FULL
    results: dict[int, dict[str, float]] = {}
    for nbytes in sizes:
        iterations, batches = plan.get(nbytes, (10, 3))
        torch_us, tensorarena_us = _time_pair(
            torch_cycle, tensorarena_cycle, nbytes, iterations, batches
        )
        results[nbytes] = {
            "torch_us": round(torch_us, 3),
            "tensorarena_us": round(tensorarena_us, 3),
            "speedup": round(torch_us / tensorarena_us, 3),
        }
    return results


# --- owner mechanisms and the 64 KiB breakdown (--owners) -------------------------------------


class _NullResource:
    """Hands out one fixed address and frees nothing: isolates the cost of making the array."""

    memory_kind = MemoryKind.HOST  # the address is a real buffer's

    def __init__(self, address: int) -> None:
        self.address = address

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return self.address

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        pass


class _SlotOwner:
    __slots__ = ("__weakref__", "address", "nbytes", "resource")

    def __init__(self, resource: _NullResource, address: int, nbytes: int) -> None:
        self.resource = resource
        self.address = address
        self.nbytes = nbytes

    def __del__(self) -> None:
        self.resource.deallocate(self.address, self.nbytes)


def _best_us(statement: Callable[[], object], number: int, repeats: int) -> float:
    """Best of ``repeats`` batch means, in µs (the least disturbed batch on a shared machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = perf_counter()
        for _ in range(number):
            statement()
        best = min(best, (perf_counter() - start) / number * 1e6)
    return best


def measure_owners(*, quick: bool = False) -> dict[str, float]:
    """µs to make and drop a 64 KiB float32 array (plus one view) with each owner mechanism,
    and the pieces of ``tensorarena.empty`` at 64 KiB."""
    import ctypes
    import weakref

    from tensorarena.interop import default_resource, empty
    from tensorarena.interop.owner import InterfaceAllocation, block_type
    from tensorarena.interop.owner import native_owner as new_native
    from tensorarena.memory.host import HostMemory

    number, repeats = (2000, 3) if quick else (20000, 7)
    host = HostMemory()
    nbytes = 64 << 10
    address = host.allocate(nbytes)
    null = _NullResource(address)
    count = nbytes // 4

    def interface_owner() -> None:
        interface = {"data": (address, False), "shape": (count,), "typestr": "<f4", "version": 3}
        array = np.asarray(InterfaceAllocation(null, address, nbytes, interface))
        view = array[1:]
        del array, view

    block_type(nbytes)
    block = block_type(nbytes)  # the second request for a size makes its type
    float32 = np.dtype(np.float32)

    def block_owner() -> None:
        owner = block.from_address(address)
        owner.resource = null
        owner.address = address
        array = np.frombuffer(owner, float32, count)
        view = array[1:]
        del array, view, owner

    def native_block_owner() -> None:
        owner: Any = new_native(null, address, nbytes)  # type: ignore[misc]  # not None here
        array = np.frombuffer(owner, float32)
        view = array[1:]
        del array, view

    def ctypes_owner_attribute() -> None:
        buffer = (ctypes.c_char * nbytes).from_address(address)
        buffer._owner = _SlotOwner(null, address, nbytes)  # type: ignore[attr-defined]
        array = np.frombuffer(buffer, np.float32)  # type: ignore[call-overload]
        view = array[1:]
        del array, view

    def ctypes_finalize() -> None:
        buffer = (ctypes.c_char * nbytes).from_address(address)
        weakref.finalize(buffer, null.deallocate, address, nbytes)
        array = np.frombuffer(buffer, np.float32)  # type: ignore[call-overload]
        view = array[1:]
        del array, view

    def numpy_empty() -> None:
        array = np.empty(count, np.float32)
        view = array[1:]
        del array, view

    resource = default_resource()

    def resource_pair() -> None:
        block = resource.allocate(nbytes)
        resource.deallocate(block, nbytes)

    def empty_null() -> None:
        array = empty(nbytes, np.uint8, resource=null)
        del array

    def empty_default() -> None:
        array = empty(nbytes, np.uint8)
        array[::PAGE] = 1
        del array

    def numpy_cycle() -> None:
        _numpy_cycle(nbytes)

    cases: dict[str, Callable[[], None]] = {}
    if new_native is not None:  # the compiled build
        cases["owner_native_frombuffer_us"] = native_block_owner
    cases |= {
        "owner_block_frombuffer_us": block_owner,
        "owner_interface_us": interface_owner,
        "owner_ctypes_attribute_us": ctypes_owner_attribute,
        "owner_ctypes_finalize_us": ctypes_finalize,
        "owner_none_np_empty_us": numpy_empty,
        "default_resource_pair_us": resource_pair,
        "empty_over_null_resource_us": empty_null,
        "empty_touch_free_us": empty_default,
        "np_empty_touch_free_us": numpy_cycle,
    }
    cases.update(_torch_pieces(null, nbytes))
    try:
        return {name: round(_best_us(case, number, repeats), 3) for name, case in cases.items()}
    finally:
        host.deallocate(address, nbytes)


def _torch_pieces(null: _NullResource, nbytes: int) -> dict[str, Callable[[], None]]:
    """The torch side of the 64 KiB breakdown (none without torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return {}
    import torch

    from tensorarena.interop import empty

    def torch_empty() -> None:
        tensor = torch.empty(nbytes, dtype=torch.uint8)
        del tensor

    def empty_torch_null() -> None:
        tensor = empty(nbytes, np.uint8, resource=null, like="torch")
        del tensor

    def torch_touch() -> None:
        tensor = torch.empty(nbytes, dtype=torch.uint8)
        tensor[::PAGE] = 1
        del tensor

    def empty_torch_touch() -> None:
        tensor = empty(nbytes, np.uint8, like="torch")
        tensor[::PAGE] = 1
        del tensor

    return {
        "torch_empty_free_us": torch_empty,
        "empty_torch_over_null_resource_us": empty_torch_null,
        "torch_empty_touch_free_us": torch_touch,
        "empty_torch_touch_free_us": empty_torch_touch,
    }


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``."""
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--quick", action="store_true", help="a short run (for tests)")
    parser.add_argument(
        "--owners",
        action="store_true",
        help="also time the array-owner mechanisms and the pieces of a 64 KiB tensorarena.empty",
    )


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; print a table (or JSON with ``--json``); return the exit status."""
    results = measure(list(SIZES.values()), quick=args.quick)
    by_name = {name: results[nbytes] for name, nbytes in SIZES.items()}
    owners = measure_owners(quick=args.quick) if getattr(args, "owners", False) else None
    tensors = measure_torch(list(TORCH_SIZES.values()), quick=args.quick)
    torch_by_name = (
        None if tensors is None else {name: tensors[n] for name, n in TORCH_SIZES.items()}
    )
    if args.json:
        document: dict[str, object] = {"build": build(), **by_name["64MiB"]}
        document["sizes"] = by_name
        document["torch"] = torch_by_name
        if owners is not None:
            document["owners"] = owners
        print(json.dumps(document, indent=2))
        return 0
    print(
        "alloc + first touch (1 byte / 4 KiB page) + free, median of batch means; "
        f"{build()} build"
    )
    print(f"{'size':>8}  {'np.empty µs':>12}  {'tensorarena µs':>15}  {'speedup':>8}")
    for name, row in by_name.items():
        print(
            f"{name:>8}  {row['numpy_us']:>12.2f}  {row['tensorarena_us']:>15.2f}  "
            f"{row['speedup']:>7.2f}x"
        )
    if torch_by_name is not None:
        print(f"\n{'size':>8}  {'torch.empty µs':>14}  {'like=torch µs':>14}  {'speedup':>8}")
        for name, row in torch_by_name.items():
            print(
                f"{name:>8}  {row['torch_us']:>14.2f}  {row['tensorarena_us']:>14.2f}  "
                f"{row['speedup']:>7.2f}x"
            )
    if owners is not None:
        print("\n64 KiB pieces, best batch mean (µs):")
        for name, value in owners.items():
            print(f"  {name:<30} {value:>8.3f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run as a script: ``python -m tensorarena.bench.reuse [--json] [--quick]``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench reuse", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
