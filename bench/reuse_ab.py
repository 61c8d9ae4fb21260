"""Two builds of tensorarena side by side on the ``bench reuse`` cycle, for a loaded machine.

``python bench/reuse_ab.py BEFORE_SRC AFTER_SRC [ROUNDS]`` starts one worker process per source
tree (``PYTHONPATH=<src>``) and alternates short rounds between them (ABBA order). Each round
times, in its own process, alloc + first touch (1 byte per 4 KiB page) + free at 64 KiB and
1 MiB for ``np.empty``, ``tensorarena.empty``, ``torch.empty`` and ``empty(like="torch")``, in
thread CPU time (time the process spends descheduled is not counted). The table gives medians
over rounds, and the ratios are the medians of the per-round ratios within one process, which
is what survives a machine whose load changes from second to second.

Both workers first free a 64 MiB NumPy array, as ``bench reuse`` does before its torch section:
that raises glibc's mmap threshold, without which whether ``torch.empty(1 MiB)`` is an mmap per
call (~130 µs) depends on each process's history. A benchmark, not a test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

PAGE = 4096
SIZES = {"64KiB": 64 << 10, "1MiB": 1 << 20}
KINDS = ("np", "ta", "torch", "ta_torch")


def _worker() -> None:
    import numpy as np
    import torch

    from tensorarena._version import build
    from tensorarena.interop import default_resource, empty

    default_resource()
    uint8 = torch.uint8

    def numpy_cycle(n: int) -> None:
        array = np.empty(n, np.uint8)
        array[::PAGE] = 1

    def ta_cycle(n: int) -> None:
        array = empty(n, np.uint8)
        array[::PAGE] = 1

    def torch_cycle(n: int) -> None:
        tensor = torch.empty(n, dtype=uint8)
        tensor[::PAGE] = 1

    def ta_torch_cycle(n: int) -> None:
        tensor = empty(n, np.uint8, like="torch")
        tensor[::PAGE] = 1

    cases = {"np": numpy_cycle, "ta": ta_cycle, "torch": torch_cycle, "ta_torch": ta_torch_cycle}
    np.empty(64 << 20, np.uint8)[::PAGE] = 1  # see the module docstring
    for cycle in cases.values():
        for n in SIZES.values():
            for _ in range(300):
                cycle(n)
    print(json.dumps({"build": build()}), flush=True)
    for _ in sys.stdin:
        row = {}
        for size, n in SIZES.items():
            iterations = 1500 if n < (1 << 20) else 600
            for name, cycle in cases.items():
                start = time.thread_time_ns()
                for _ in range(iterations):
                    cycle(n)
                row[f"{name}@{size}"] = (time.thread_time_ns() - start) / iterations / 1e3
        print(json.dumps(row), flush=True)


def _spawn(src: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": src}
    worker = subprocess.Popen(
        [sys.executable, __file__, "--worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/",
    )
    assert worker.stdout is not None
    print(f"{src}: {json.loads(worker.stdout.readline())['build']} build", file=sys.stderr)
    return worker


def main(before: str, after: str, rounds: int) -> None:
    workers = {"before": _spawn(before), "after": _spawn(after)}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in workers}
    for index in range(rounds):
        for name in ("before", "after") if index % 2 == 0 else ("after", "before"):
            worker = workers[name]
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write("run\n")
            worker.stdin.flush()
            rows[name].append(json.loads(worker.stdout.readline()))
    for worker in workers.values():
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait()

    def median(name: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[name])

    def ratio(name: str, top: str, bottom: str) -> float:
        return statistics.median(row[top] / row[bottom] for row in rows[name])

    print("| size | build | np.empty µs | ta µs | ta/np | torch.empty µs | like=torch µs | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for size in SIZES:
        for name in ("before", "after"):
            numpy, ta, torch, ta_torch = (f"{kind}@{size}" for kind in KINDS)
            print(
                f"| {size} | {name} | {median(name, numpy):.2f} | {median(name, ta):.2f} | "
                f"{ratio(name, ta, numpy):.2f} | {median(name, torch):.2f} | "
                f"{median(name, ta_torch):.2f} | {ratio(name, ta_torch, torch):.2f} |"
            )


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()
    else:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 60)
