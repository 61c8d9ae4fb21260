"""Host↔device copy bandwidth by kind of host memory, both directions, 1 MiB to 1 GiB.

The source document's section on pinned memory, measured: pageable memory makes the driver stage
copies through its own pinned bounce buffer; page-locked memory that the *driver knows about*
(cudaHostAlloc / cudaHostRegister) is copied by DMA directly. ``mlock`` alone keeps pages
resident, but the driver does not know they are locked. Side by side in one run, per size:

- ``pageable``         np.empty
- ``locked``           tensorarena ``LockedHostMemory`` (mmap + mlock: page-locked only)
- ``registered``       np.empty after ``tensorarena.memory.cuda.register`` (cudaHostRegister)
- ``pinned``           tensorarena ``PinnedHostMemory()``: cudaHostAlloc where CUDA is present
- ``staged``           ``Transfers.to_device``/``to_host`` from *pageable* memory through the
                       pinned pool in 8 MiB chunks (wall time: host memmove + DMA, pipelined)

``cudaMemcpyAsync`` through our runtime wrapper on PyTorch's current stream, timed with CUDA
events, median of ``--repeats``; GB/s = 1e9 bytes per second. ``issue_us`` (host→device only)
is how long the host thread was blocked in the call: microseconds for driver-pinned memory
(the copy overlaps host work), the whole copy for pageable memory.
Usage: python bench/gpu_transfer.py [--json] [--sizes 1MiB,...,1GiB] [--repeats 5]
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from typing import Any

from gpu_common import MiB, emit, gpu_torch, machine, parse_sizes, size_parser

DEFAULT_SIZES = "1MiB,4MiB,16MiB,64MiB,256MiB,1GiB"
KINDS = ("pageable", "locked", "registered", "pinned")


def _copy_rate(torch: Any, runtime: Any, dst: int, src: int, nbytes: int, repeats: int
               ) -> tuple[float, float]:
    """(GB/s, µs the host was blocked issuing the copy), medians."""
    stream = torch.cuda.current_stream().cuda_stream
    runtime.memcpy_async(dst, src, nbytes, stream)  # warm-up
    torch.cuda.synchronize()
    rates, issue = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        runtime.memcpy_async(dst, src, nbytes, stream)
        issue.append((time.perf_counter() - began) * 1e6)
        end.record()
        end.synchronize()
        rates.append(nbytes / (start.elapsed_time(end) * 1e-3) / 1e9)
    return round(statistics.median(rates), 2), round(statistics.median(issue), 1)


def _host_buffer(kind: str, nbytes: int, keep: list[Any]) -> int:
    import numpy as np

    from tensorarena.memory import LockedHostMemory, PinnedHostMemory
    from tensorarena.memory.cuda import register

    if kind in ("pageable", "registered"):
        array = np.empty(nbytes, np.uint8)
        array[::4096] = 1  # fault every page in before timing
        keep.append(array)
        if kind == "registered":
            keep.append(register(array))
        return int(array.ctypes.data)
    resource = LockedHostMemory(limit=1 << 40) if kind == "locked" else PinnedHostMemory()
    address = resource.allocate(nbytes, 4096)
    ctypes.memset(address, 1, nbytes)
    keep.append((resource, address, nbytes))
    return int(address)


def _release(keep: list[Any]) -> None:
    for item in reversed(keep):
        if isinstance(item, tuple):
            resource, address, nbytes = item
            resource.deallocate(address, nbytes)
        elif hasattr(item, "close"):
            item.close()
    keep.clear()


def _staged(torch: Any, transfers: Any, nbytes: int, repeats: int) -> dict[str, float]:
    import numpy as np

    data = np.ones(nbytes, np.uint8)
    up, down = [], []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        on_device = transfers.to_device(data)
        torch.cuda.synchronize()
        middle = time.perf_counter()
        transfers.to_host(on_device, out=data)
        up.append(nbytes / (middle - began) / 1e9)
        down.append(nbytes / (time.perf_counter() - middle) / 1e9)
        del on_device
    return {"h2d_gb_per_s": round(statistics.median(up[1:]), 2),
            "d2h_gb_per_s": round(statistics.median(down[1:]), 2)}


def run(torch: Any, sizes: list[int], repeats: int) -> dict[str, dict[str, dict[str, float]]]:
    from tensorarena.interop.transfers import CudaCopies, Transfers
    from tensorarena.memory import device_pool, pinned_pool
    from tensorarena.memory.cuda import cuda_runtime

    runtime = cuda_runtime()
    transfers = Transfers(device_pool(), pinned_pool(), CudaCopies(runtime))
    results: dict[str, dict[str, dict[str, float]]] = {}
    for nbytes in sizes:
        device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        row: dict[str, dict[str, float]] = {}
        for kind in KINDS:
            keep: list[Any] = []
            try:
                host = _host_buffer(kind, nbytes, keep)
                h2d, issue = _copy_rate(torch, runtime, device.data_ptr(), host, nbytes, repeats)
                d2h, _ = _copy_rate(torch, runtime, host, device.data_ptr(), nbytes, repeats)
                row[kind] = {"h2d_gb_per_s": h2d, "d2h_gb_per_s": d2h, "issue_us": issue}
            except Exception as exc:  # one kind failing (a memlock limit) must not hide the rest
                row[kind] = {"error": f"{type(exc).__name__}: {exc}"[:200]}  # type: ignore[dict-item]
            finally:
                _release(keep)
        row["staged"] = _staged(torch, transfers, nbytes, repeats)
        transfers.synchronize()
        del device
        results[str(nbytes)] = row
        print(f"{nbytes // MiB} MiB done", file=sys.stderr, flush=True)
    return results


def _table(record: dict[str, Any]) -> None:
    print(f"host↔device copies on {record['machine']['device']}, GB/s (median)")
    print(f"{'size':>9} {'host memory':<12} {'H2D':>8} {'D2H':>8} {'H2D issue µs':>13}")
    for nbytes, row in record["sizes"].items():
        for kind, m in row.items():
            if "error" in m:
                print(f"{int(nbytes) // MiB:>5} MiB {kind:<12} {m['error']}")
                continue
            issue = f"{m['issue_us']:>13.1f}" if "issue_us" in m else f"{'':>13}"
            print(f"{int(nbytes) // MiB:>5} MiB {kind:<12} {m['h2d_gb_per_s']:>8.2f} "
                  f"{m['d2h_gb_per_s']:>8.2f} {issue}")


def main(argv: list[str] | None = None) -> int:
    args = size_parser(__doc__, sizes=DEFAULT_SIZES, repeats=5).parse_args(argv)
    torch = gpu_torch()
    if torch is None:
        return 0
    sizes = parse_sizes(args.sizes)
    record = {"machine": machine(torch), "repeats": args.repeats,
              "sizes": run(torch, sizes, args.repeats)}
    emit(record, as_json=args.json, table=_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
