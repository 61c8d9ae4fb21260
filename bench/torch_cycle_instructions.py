"""Instructions and cache misses per cycle of ``torch.empty`` and ``empty(like="torch")``.

``python bench/torch_cycle_instructions.py [SRC] [N]`` runs one process under
``valgrind --tool=callgrind`` (``PYTHONPATH=SRC``, default ``src``) that times each case over ``N``
cycles (default 5000) between callgrind client requests (a three-line C helper, compiled here
with ``cc`` against valgrind's ``callgrind.h``): only the cycles are counted, not start-up,
imports or the other cases. Deterministic where wall time on a shared machine is not, so small
changes to the path show. Callgrind also simulates the caches (``--cache-sim=yes``: a 32 KiB
8-way L1 for instructions and one for data, as this machine's): in the touch cycle torch's code
evicts ours between iterations, and the L1 misses, not the instructions, are what the time
follows. Still a model, not time: ``bench/reuse_ab.py`` remains the judge. One intra-op thread
(``OMP_NUM_THREADS=1``: callgrind counts every thread, and idle OpenMP workers would add
instructions at random) and a fixed hash seed. Cases, 64 KiB of ``uint8``: made and freed
(``make``), and made, touched once per 4 KiB page and freed (``touch``, the ``bench reuse``
cycle); and NumPy arrays made and freed, by ``np.empty``, by ``empty`` (in the compiled build its
C entry) and by the Python function behind it (``interop.arrays.empty``). Needs valgrind, its
headers and a C compiler; says which is missing and exits 0 without them. A benchmark, not a
test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "torch.empty make": "torch.empty(NBYTES, dtype=torch.uint8)",
    "like=torch make": "empty(NBYTES, np.uint8, like='torch')",
    "torch.empty touch": "torch.empty(NBYTES, dtype=torch.uint8)[::4096] = 1",
    "like=torch touch": "empty(NBYTES, np.uint8, like='torch')[::4096] = 1",
    "np.empty make": "np.empty(NBYTES, np.uint8)",
    "empty make": "empty(NBYTES, np.uint8)",
    "empty make (the function)": "arrays.empty(NBYTES, np.uint8)",
}

_HELPER = """
#include <valgrind/callgrind.h>
void start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void stop(const char *name) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS_AT(name); }
"""

_WORKER = """
import ctypes, sys, timeit
import numpy as np
import torch
from tensorarena.interop import arrays, default_resource, empty
NBYTES = 64 << 10
default_resource()
np.empty(64 << 20, np.uint8)[::4096] = 1  # raise glibc's mmap threshold, as bench reuse does
helper = ctypes.CDLL(sys.argv[1])
helper.stop.argtypes = [ctypes.c_char_p]
cycles = int(sys.argv[2])
for name, statement in {cases!r}.items():
    timer = timeit.Timer(statement, globals=globals())
    timer.timeit(200)  # warm: caches, routes, glibc's heap
    helper.start()
    timer.timeit(cycles)
    helper.stop(name.encode())
"""


def _missing() -> str | None:
    if shutil.which("valgrind") is None:
        return "valgrind"
    if shutil.which("cc") is None:
        return "a C compiler (cc)"
    if not Path("/usr/include/valgrind/callgrind.h").is_file():
        return "valgrind's headers (valgrind/callgrind.h)"
    return None


def measure(src: str, cycles: int) -> dict[str, dict[str, float]]:
    """``{case: {event: count per cycle}}``: instructions (``Ir``), L1 instruction-fetch misses
    (``I1mr``), L1 data read and write misses (``D1mr``, ``D1mw``)."""
    with tempfile.TemporaryDirectory() as work:
        helper = os.path.join(work, "helper.so")
        with open(os.path.join(work, "helper.c"), "w") as file:
            file.write(_HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", helper, file.name], check=True)
        script = os.path.join(work, "worker.py")
        with open(script, "w") as file:
            file.write(_WORKER.format(cases=CASES))
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--cache-sim=yes",
             f"--callgrind-out-file={out}", sys.executable, script, helper, str(cycles)],
            env={**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"},
            check=True, capture_output=True,
        )  # fmt: skip
        per_cycle = {}
        for dump in Path(work).glob("callgrind.out.*"):
            text = dump.read_text()
            name = re.search(r"^desc: Trigger: Client Request: (.+)$", text, re.MULTILINE)
            events = re.search(r"^events: (.+)$", text, re.MULTILINE)
            totals = re.search(r"^summary: (.+)$", text, re.MULTILINE)
            if name and events and totals:
                counts = zip(events.group(1).split(), totals.group(1).split(), strict=False)
                per_cycle[name.group(1)] = {event: int(n) / cycles for event, n in counts}
        return per_cycle


def main(src: str, cycles: int) -> None:
    missing = _missing()
    if missing is not None:
        print(f"{missing} is not installed: nothing measured")
        return
    per_cycle = measure(src, cycles)
    print(f"per cycle ({src}, {cycles} cycles): instructions, L1 instruction and data misses")
    print("| case | event | reference | measured | ratio |")
    print("|---|---|---|---|---|")
    pairs = [
        ("make", "torch.empty make", "like=torch make"),
        ("touch", "torch.empty touch", "like=torch touch"),
        ("NumPy make: np.empty / empty", "np.empty make", "empty make"),
        ("NumPy make: the function / the entry", "empty make (the function)", "empty make"),
    ]
    for case, reference, measured in pairs:
        torch_counts, ours = per_cycle[reference], per_cycle[measured]
        for event in ("Ir", "I1mr", "D1mr", "D1mw"):
            theirs, mine = torch_counts.get(event, 0.0), ours.get(event, 0.0)
            ratio = f"{mine / theirs:.2f}" if theirs >= 1 else "-"
            print(f"| {case} | {event} | {theirs:,.0f} | {mine:,.0f} | {ratio} |")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "src", int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    )
