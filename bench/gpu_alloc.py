"""Device allocation latency from Python: our pools vs cudaMalloc vs PyTorch's and CuPy's pools.

One allocate+free pair per call, median of 5 batches, in µs, side by side in one run, for each
size (default 4 KiB, 1 MiB, 64 MiB):

- ``ta_pool``            ``Pool(CudaMemory())`` (best fit) allocate + deallocate: integers only
- ``ta_stream_ordered``  the same pool behind ``StreamOrdered`` with CUDA events, one stream
- ``ta_device_empty``    ``tensorarena.device_empty`` + ``del``: an array object over the pool
- ``cudaMalloc``         ``CudaMemory`` itself: cudaMalloc + cudaFree through our checked wrapper
- ``torch_empty``        ``torch.empty(n, uint8, device="cuda")`` + ``del``: the caching allocator
- ``cupy_pool``          ``cupy.get_default_memory_pool().malloc(n)`` + ``del``
- ``torch_pluggable``    ``torch.empty`` + ``del`` inside ``torch.cuda.use_mem_pool`` over our
                         allocator (``TorchAllocator().mem_pool()``, in a child process):
                         what routing PyTorch through Python costs

A benchmark, not a test: it asserts nothing. Usage: python bench/gpu_alloc.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from gpu_common import MiB, emit, gpu_torch, machine, per_call_us

SIZES = (4096, MiB, 64 * MiB)


def _calls(nbytes: int, fast: bool) -> int:
    if not fast:
        return 50 if nbytes >= 64 * MiB else 200
    return 2000


def run(torch: Any, sizes: tuple[int, ...]) -> dict[str, dict[str, float]]:
    import numpy as np

    import tensorarena as ta
    from tensorarena.adaptors import StreamOrdered
    from tensorarena.memory import Doubling, Pool
    from tensorarena.memory.cuda import CudaEvents, CudaMemory

    pool = Pool(CudaMemory(), strategy="best_fit", initial_size="256MiB", growth=Doubling("1GiB"))
    ordered = StreamOrdered(Pool(CudaMemory(), strategy="best_fit", initial_size="256MiB"),
                            events=CudaEvents(), default_stream=0)
    raw = CudaMemory()
    try:
        import cupy

        cupy_pool = cupy.get_default_memory_pool()
    except ImportError:
        cupy_pool = None
    results: dict[str, dict[str, float]] = {}
    for nbytes in sizes:
        row: dict[str, float] = {}

        def pair(resource: Any = pool, n: int = nbytes) -> None:
            resource.deallocate(resource.allocate(n), n)

        row["ta_pool"] = per_call_us(pair, calls=_calls(nbytes, True))
        row["ta_stream_ordered"] = per_call_us(
            lambda n=nbytes: pair(ordered, n), calls=_calls(nbytes, True)
        )
        row["ta_device_empty"] = per_call_us(  # the array dies at once: its block goes back
            lambda n=nbytes: ta.device_empty(n, np.uint8, resource=pool),
            calls=_calls(nbytes, True),
        )
        row["cudaMalloc"] = per_call_us(lambda n=nbytes: pair(raw, n), calls=_calls(nbytes, False))
        row["torch_empty"] = per_call_us(
            lambda n=nbytes: torch.empty(n, dtype=torch.uint8, device="cuda"),
            calls=_calls(nbytes, True),
        )
        if cupy_pool is not None:
            row["cupy_pool"] = per_call_us(
                lambda n=nbytes: cupy_pool.malloc(n), calls=_calls(nbytes, True)
            )
        results[str(nbytes)] = row
    return results


def pluggable(sizes: tuple[int, ...]) -> dict[str, float]:
    """torch.empty + del through our allocator, measured in a child process."""
    code = (
        "import json, sys, torch\n"
        "sys.path.insert(0, 'bench')\n"
        "from gpu_common import per_call_us\n"
        "from tensorarena.interop.torch_allocator import TorchAllocator, build_shim, find_shim\n"
        "allocator = TorchAllocator(shim=find_shim() or build_shim())\n"
        "with torch.cuda.use_mem_pool(allocator.mem_pool()):\n"
        f"    sizes = {list(sizes)}\n"
        "    print(json.dumps({str(n): per_call_us(lambda n=n: torch.empty(n, dtype=torch.uint8, "
        "device='cuda'), calls=2000) for n in sizes}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:200] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _table(record: dict[str, Any]) -> None:
    print(f"allocate+free from Python on {record['machine']['device']}, µs per pair (median)")
    rows = record["sizes"]
    kinds: list[str] = []
    for row in rows.values():
        kinds += [kind for kind in row if kind not in kinds]
    print(f"{'size':>8} " + " ".join(f"{k:>18}" for k in kinds))
    for nbytes, row in rows.items():
        label = f"{int(nbytes) // 1024} KiB" if int(nbytes) < MiB else f"{int(nbytes) // MiB} MiB"
        print(f"{label:>8} " + " ".join(f"{row.get(k, float('nan')):>18.2f}" for k in kinds))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-pluggable", action="store_true")
    args = parser.parse_args(argv)
    torch = gpu_torch()
    if torch is None:
        return 0
    record: dict[str, Any] = {"machine": machine(torch), "sizes": run(torch, SIZES)}
    if not args.no_pluggable:
        extra = pluggable(SIZES)
        for nbytes, row in record["sizes"].items():
            row["torch_pluggable"] = extra.get(nbytes, float("nan"))
        if "error" in extra:
            record["torch_pluggable_error"] = extra["error"]
    emit(record, as_json=args.json, table=_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
