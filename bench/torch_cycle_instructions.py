"""Instructions per cycle of ``torch.empty`` and ``tensorarena.empty(like="torch")``, by callgrind.

``python bench/torch_cycle_instructions.py [SRC] [N]`` runs each case twice under
``valgrind --tool=callgrind`` (``N`` and ``3 N`` cycles, ``PYTHONPATH=SRC``, default ``src``) and
reports the difference over ``2 N``: the instructions one cycle costs, start-up and imports
cancelled out. Deterministic where wall time on a shared machine is not, so small changes to the
path show; instructions are not time (cache misses are not counted), so ``bench/reuse_ab.py``
remains the judge. Cases, 64 KiB of ``uint8``: made and freed (``make``), and made, touched once
per 4 KiB page and freed (``touch``, the ``bench reuse`` cycle). Needs valgrind; says so and
exits 0 without it. A benchmark, not a test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

CASES = {
    "torch.empty make": "torch.empty(NBYTES, dtype=torch.uint8)",
    "like=torch make": "empty(NBYTES, np.uint8, like='torch')",
    "torch.empty touch": "torch.empty(NBYTES, dtype=torch.uint8)[::4096] = 1",
    "like=torch touch": "empty(NBYTES, np.uint8, like='torch')[::4096] = 1",
}

_WORKER = """
import sys
import numpy as np
import torch
from tensorarena.interop import default_resource, empty
NBYTES = 64 << 10
default_resource()
np.empty(64 << 20, np.uint8)[::4096] = 1  # raise glibc's mmap threshold, as bench reuse does
for _ in range(int(sys.argv[1])):
    {statement}
"""


def _instructions(src: str, statement: str, cycles: int) -> int:
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(work, "worker.py")
        with open(script, "w") as file:
            file.write(_WORKER.format(statement=statement))
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             script, str(cycles)],
            env={**os.environ, "PYTHONPATH": src}, check=True, capture_output=True,
        )  # fmt: skip
        with open(out) as file:
            summary = re.search(r"^summary: (\d+)", file.read(), re.MULTILINE)
        assert summary is not None, "callgrind wrote no summary"
        return int(summary.group(1))


def main(src: str, cycles: int) -> None:
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured")
        return
    per_cycle = {}
    for name, statement in CASES.items():
        low = _instructions(src, statement, cycles)
        high = _instructions(src, statement, 3 * cycles)
        per_cycle[name] = (high - low) / (2 * cycles)
    print(f"instructions per cycle ({src}, {cycles} and {3 * cycles} cycles)")
    print("| case | torch.empty | like=torch | ratio |")
    print("|---|---|---|---|")
    for case in ("make", "touch"):
        torch_n, ours = per_cycle[f"torch.empty {case}"], per_cycle[f"like=torch {case}"]
        print(f"| {case} | {torch_n:,.0f} | {ours:,.0f} | {ours / torch_n:.2f} |")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "src", int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    )
