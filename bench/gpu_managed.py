"""Managed (unified) memory with and without prefetching, against plain device memory.

The source document: managed memory migrates pages on demand, which costs page faults; hints
(``cudaMemAdvise``) and prefetching (``cudaMemPrefetchAsync``) move the pages ahead of use.
For each size, the host first writes every page (so the pages live on the host), then a GPU
kernel (``torch.sum`` over the same bytes, zero-copy through ``__cuda_array_interface__``) reads
them, timed with CUDA events:

- ``device``             the same kernel over ``cudaMalloc`` memory (the floor)
- ``managed_faulting``   over managed memory, pages migrated by faults as the kernel touches them
- ``managed_prefetched`` ``ManagedMemory.prefetch`` to the GPU, then the kernel (both timed)
- ``host_read_faulting`` / ``host_read_prefetched``: after the GPU wrote the pages, the host
  sums them (wall time), without and with a prefetch back to the CPU first

A benchmark, not a test. Usage: python bench/gpu_managed.py [--json] [--sizes 256MiB,1GiB]
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from gpu_common import MiB, emit, gpu_ms, gpu_torch, machine, parse_sizes, size_parser


class _View:
    """The CUDA array interface of a host array (owns nothing; keeps the array alive)."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "version": 3,
            "data": (array.ctypes.data, False), "strides": None, "stream": None,
        }


def _one(torch: Any, nbytes: int, repeats: int) -> dict[str, float]:
    import numpy as np

    import tensorarena as ta
    from tensorarena.memory.cuda import ManagedMemory

    count = nbytes // 4
    row: dict[str, float] = {}
    baseline = torch.ones(count, device="cuda")
    row["device_ms"] = round(gpu_ms(torch, lambda: baseline.sum(), repeats=repeats), 3)
    managed = ManagedMemory()
    host = ta.empty(count, np.float32, resource=managed)
    device = torch.as_tensor(_View(host), device="cuda")
    address, stream = host.ctypes.data, torch.cuda.current_stream().cuda_stream

    faulting, prefetched, host_faulting, host_prefetched = [], [], [], []
    for _ in range(repeats):
        host[:] = 1.0  # every page back on the host
        faulting.append(gpu_ms(torch, lambda: device.sum(), repeats=1, warm_up=False))
        host[:] = 1.0
        prefetched.append(gpu_ms(torch, lambda: (
            managed.prefetch(address, host.nbytes, stream=stream), device.sum()),
            repeats=1, warm_up=False))
        device.fill_(2.0)  # the pages now live on the GPU
        torch.cuda.synchronize()
        began = time.perf_counter()
        host.sum()
        host_faulting.append((time.perf_counter() - began) * 1e3)
        device.fill_(2.0)
        managed.prefetch(address, host.nbytes, "cpu", stream=stream)
        torch.cuda.synchronize()
        began = time.perf_counter()
        host.sum()
        host_prefetched.append((time.perf_counter() - began) * 1e3)
    row["managed_faulting_ms"] = round(statistics.median(faulting), 3)
    row["managed_prefetched_ms"] = round(statistics.median(prefetched), 3)
    row["host_read_faulting_ms"] = round(statistics.median(host_faulting), 3)
    row["host_read_prefetched_ms"] = round(statistics.median(host_prefetched), 3)
    return row  # the arrays die here: the managed block goes back


def _table(record: dict[str, Any]) -> None:
    print(f"managed memory on {record['machine']['device']}, ms (median of {record['repeats']})")
    keys = ("device_ms", "managed_faulting_ms", "managed_prefetched_ms",
            "host_read_faulting_ms", "host_read_prefetched_ms")
    print(f"{'size':>9} " + " ".join(f"{k.removesuffix('_ms'):>21}" for k in keys))
    for nbytes, row in record["sizes"].items():
        if "error" in row:
            print(f"{int(nbytes) // MiB:>5} MiB error: {row['error']}")
            continue
        print(f"{int(nbytes) // MiB:>5} MiB " + " ".join(f"{row[k]:>21.3f}" for k in keys))


def main(argv: list[str] | None = None) -> int:
    args = size_parser(__doc__, sizes="256MiB,1GiB", repeats=3).parse_args(argv)
    torch = gpu_torch()
    if torch is None:
        return 0
    sizes = parse_sizes(args.sizes)
    rows = {}
    for nbytes in sizes:
        try:
            rows[str(nbytes)] = _one(torch, nbytes, args.repeats)
        except Exception as exc:  # a refused prefetch must not hide the other sizes
            rows[str(nbytes)] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"{nbytes // MiB} MiB done", file=sys.stderr, flush=True)
    record = {"machine": machine(torch), "repeats": args.repeats, "sizes": rows}
    emit(record, as_json=args.json, table=_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
