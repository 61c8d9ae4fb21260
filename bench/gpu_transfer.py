"""Host-to-device copy bandwidth by kind of host memory (needs a CUDA GPU and torch).

The source document's section on pinned memory, measured: pageable memory makes the driver stage
copies through its own pinned bounce buffer; page-locked memory that the *driver knows about*
(cudaHostAlloc / cudaHostRegister) is copied by DMA directly and lets copies overlap compute.
``mlock`` alone keeps pages resident but the driver does not know they are locked, so it is expected
to behave like pageable memory. This script prints GB/s for each kind, side by side in one run:

- ``numpy``            pageable, np.empty
- ``host_mmap``        pageable, tensorarena HostMemory (anonymous mmap)
- ``mlock``            tensorarena PinnedHostMemory without CUDA (mmap + mlock)
- ``mlock+register``   the same bytes after cudaHostRegister
- ``torch_pinned``     torch.empty(pin_memory=True): cudaHostAlloc via PyTorch's host allocator

It also times how long the *host* is blocked issuing a non_blocking copy: with pageable memory the
call returns only after staging, with registered memory at once (copy/compute overlap).
Usage: python bench/gpu_transfer.py [--json] [--sizes 64MiB,1GiB]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time


def _as_numpy(address: int, nbytes: int):  # type: ignore[no-untyped-def]
    import numpy as np

    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


def _measure(torch, host, device, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Return (GB/s of the copy, microseconds the host was blocked issuing it)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device.copy_(host, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    rates, issue_us = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start.record()
        t0 = time.perf_counter()
        device.copy_(host, non_blocking=True)
        issue_us.append((time.perf_counter() - t0) * 1e6)
        end.record()
        end.synchronize()
        rates.append(host.numel() / (start.elapsed_time(end) * 1e-3) / 1e9)
    return statistics.median(rates), statistics.median(issue_us)


def run(sizes: list[int], repeats: int) -> dict[str, object]:
    import numpy as np
    import torch

    from tensorarena.memory import HostMemory, PinnedHostMemory

    cudart = torch.cuda.cudart()
    results: dict[str, object] = {"device": torch.cuda.get_device_name(0), "sizes": {}}
    for nbytes in sizes:
        device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        row: dict[str, dict[str, float]] = {}

        array = np.empty(nbytes, dtype=np.uint8)
        array[::4096] = 1
        row["numpy"] = _pair(_measure(torch, torch.from_numpy(array), device, repeats))

        host = HostMemory()
        address = host.allocate(nbytes, 4096)
        view = _as_numpy(address, nbytes)
        view[::4096] = 1
        row["host_mmap"] = _pair(_measure(torch, torch.from_numpy(view), device, repeats))
        del view
        host.deallocate(address, nbytes)

        pinned = PinnedHostMemory()
        address = pinned.allocate(nbytes, 4096)
        view = _as_numpy(address, nbytes)
        tensor = torch.from_numpy(view)
        row["mlock"] = _pair(_measure(torch, tensor, device, repeats))
        err = cudart.cudaHostRegister(address, nbytes, 0)
        if int(err) == 0:
            row["mlock+register"] = _pair(_measure(torch, tensor, device, repeats))
            cudart.cudaHostUnregister(address)
        del tensor, view
        pinned.deallocate(address, nbytes)

        torch_pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        row["torch_pinned"] = _pair(_measure(torch, torch_pinned, device, repeats))
        del torch_pinned, device
        results["sizes"][str(nbytes)] = row  # type: ignore[index]
    return results


def _pair(measured: tuple[float, float]) -> dict[str, float]:
    return {"gb_per_s": round(measured[0], 2), "issue_us": round(measured[1], 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64MiB,1GiB")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    from tensorarena.sizes import format_size, parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = run(sizes, args.repeats)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"host-to-device copies on {results['device']} (median of {args.repeats})")
    for nbytes, row in results["sizes"].items():  # type: ignore[attr-defined]
        print(f"\n{format_size(int(nbytes))}")
        print(f"  {'host memory':<16} {'GB/s':>8} {'issue µs':>10}")
        for kind, m in row.items():
            print(f"  {kind:<16} {m['gb_per_s']:>8.2f} {m['issue_us']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
