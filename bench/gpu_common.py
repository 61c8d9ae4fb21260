"""What the GPU benchmarks share: finding the GPU, timing, and printing one JSON record.

Every ``bench/gpu_*.py`` script prints ``skipped: <why>`` and exits 0 where there is no CUDA GPU
(or no torch, which they use for CUDA-event timing), so ``scripts/gpu_check.sh`` and CI can call
them anywhere. With ``--json`` a script prints one JSON object whose ``"machine"`` entry names
the card, the driver's view of its memory, and the versions that produced the figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20


def size_parser(doc: str, *, sizes: str, repeats: int) -> argparse.ArgumentParser:
    """The options of a benchmark over sizes: ``--sizes 1MiB,1GiB``, ``--repeats``, ``--json``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=sizes, help="comma-separated, e.g. 64MiB,1GiB")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--json", action="store_true")
    return parser


def parse_sizes(text: str) -> list[int]:
    """``"64MiB,1GiB"`` as byte counts (tensorarena's size rule)."""
    from tensorarena.sizes import parse_size

    return [parse_size(part) for part in text.split(",")]


def gpu_torch() -> Any | None:
    """``torch`` if it is installed and sees a CUDA device; else print why not and return None."""
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return None
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return None
    return torch


def machine(torch: Any) -> dict[str, Any]:
    """The card and the software versions, for the record."""
    import numpy as np

    free, total = torch.cuda.mem_get_info()
    return {
        "device": torch.cuda.get_device_name(0),
        "device_memory_mib": total // MiB,
        "free_mib": free // MiB,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def per_call_us(fn: Callable[[], Any], *, calls: int, repeats: int = 5) -> float:
    """Median over ``repeats`` batches of the microseconds one ``fn()`` takes (after a warm-up
    batch): wall time, for host-side costs such as an allocator call."""
    for _ in range(max(calls // 10, 1)):
        fn()
    batches = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        batches.append((time.perf_counter() - start) / calls * 1e6)
    return round(statistics.median(batches), 3)


def gpu_ms(torch: Any, fn: Callable[[], Any], *, repeats: int = 5, warm_up: bool = True
           ) -> float:
    """Median milliseconds of ``fn()`` on the current stream, timed by CUDA events (after one
    warm-up call unless ``warm_up=False``: first-touch costs are what some runs measure)."""
    if warm_up:
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def emit(record: dict[str, Any], *, as_json: bool, table: Callable[[dict[str, Any]], None]) -> None:
    """Print the record as one JSON line, or as the script's table."""
    if as_json:
        print(json.dumps(record))
    else:
        table(record)
    sys.stdout.flush()
