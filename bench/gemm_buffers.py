"""The GEMMs of a planned call beside eager's: the BLAS calls made, and the buffers MKL keeps.

Issue 22: after its calls, a planned GPT-2 process has more of glibc's ``mmap`` blocks than
eager's (``bench/process_floor.py``), and gdb shows them to be MKL's sgemm packing buffers,
which MKL's memory manager keeps for the process. This script asks whether the planned program
calls the GEMMs differently from eager (which would make MKL ask for other buffers), in one
fresh process per execution (``eager``, ``planned``) as ``process_floor.py`` builds them
(libraries warmed on a tiny model, then the full-size model, then the calls):

* every ``sgemm`` MKL runs during the calls, from MKL's own verbose log (``MKL_VERBOSE``):
  transposes, ``m``, ``n``, ``k`` and the leading dimensions; the two executions' sequences
  are compared call for call;
* what MKL's memory manager holds after the calls (``mkl_serv_mem_stat``: bytes, buffers);
* where glibc put it: its ``mmap`` blocks and main heap above the baseline (``mallinfo2``).

Identical sequences and identical MKL bytes with a different ``mmap`` column mean the same
buffers placed differently by glibc (its mmap threshold moves up when a large block is freed,
which eager's calls do and a planned call, whose intermediates live in the arena, does not).

Last, in a third process, the distinct GEMMs are replayed alone (same transposes, sizes and
leading dimensions, operands of zeros), once in the order the model first runs them and once
largest first, freeing MKL's buffers in between: MKL reuses a cached buffer at least as large
as it needs, so how many it keeps follows the order of the first calls. A third time in the
model's order after *seeding* MKL's cache: one ``mkl_serv_allocate`` of the largest single
buffer (what "largest first" kept, when that is one buffer) handed straight back with
``mkl_serv_deallocate``, as a runtime could do before its first call.

    .venv/bin/python bench/gemm_buffers.py [--model gpt2] [--batch 1] [--seq 128] [--calls 2]

Linux with glibc and a torch built with MKL only; elsewhere it says so and exits.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from typing import Any

MIB = 1 << 20
_SGEMM = re.compile(r"SGEMM\(([^)]*)\)")
_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
           "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _glibc(libc: Any) -> dict[str, int]:
    gc.collect()
    info = libc.mallinfo2()
    return {"heap": info.arena, "mmap": info.hblkhd}


def _mkl_held() -> dict[str, int]:
    """What MKL holds (:func:`tensorarena.interop.mkl_buffers.held`)."""
    from tensorarena.interop.mkl_buffers import held

    now = held()
    return {"mkl_bytes": 0 if now is None else now.bytes,
            "mkl_buffers": 0 if now is None else now.buffers}


def gemm_line(line: str) -> str | None:
    """``transa transb m n k lda ldb ldc`` of one ``MKL_VERBOSE SGEMM(...)`` line."""
    found = _SGEMM.search(line)
    if found is None:
        return None
    a = found.group(1).split(",")  # transa,transb,m,n,k,alpha,A,lda,B,ldb,beta,C,ldc
    return " ".join([a[0], a[1], a[2], a[3], a[4], a[7], a[9], a[12]])


def mkl_gemms(run: Any) -> list[str]:
    """Call ``run()`` with MKL's verbose log on; the :func:`gemm_line` line of each ``sgemm``."""
    import torch

    libc = ctypes.CDLL("libc.so.6")
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)  # MKL's verbose log goes to the C stdout
        try:
            torch._C._verbose.mkl_set_verbose(1)
            try:
                run()
            finally:
                torch._C._verbose.mkl_set_verbose(0)
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    return [g for g in map(gemm_line, text.splitlines()) if g]


def measure(execution: str, model_name: str, batch: int, seq: int, calls: int) -> dict[str, Any]:
    """One execution's GEMMs and buffers, in this process (the child's side)."""
    import torch

    from tensorarena.bench.exec_executions import build_execution, warm_libraries
    from tensorarena.planning.models import build_model

    torch.set_num_threads(1)
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    warm_libraries(execution, training=False)
    model, (args, kwargs) = build_model(model_name, size="base", batch=batch, seq=seq)
    model.eval()
    built = build_execution(execution, model, tuple(args), dict(kwargs), training=False)
    before = {**_glibc(libc), **_mkl_held()}

    def run() -> None:
        for _ in range(calls):
            out = built.call()
            del out
            built.drop()

    gemms = mkl_gemms(run)
    after = {**_glibc(libc), **_mkl_held()}
    return {"execution": execution, "gemms": gemms, "before": before, "after": after}


def _torch_cpu() -> Any:
    import torch

    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    lib.mkl_serv_mem_stat.restype = ctypes.c_int64
    lib.mkl_serv_mem_stat.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.mkl_serv_allocate.restype = ctypes.c_void_p
    lib.mkl_serv_allocate.argtypes = [ctypes.c_size_t, ctypes.c_int]
    lib.mkl_serv_deallocate.argtypes = [ctypes.c_void_p]
    return lib


def run_gemm(gemm: str) -> None:
    """Run the ``sgemm`` of one :func:`gemm_line` line through ``torch.mm`` (row-major: MKL's
    ``m x n`` column-major product is torch's ``n x m``), on zeros."""
    import torch

    ta, tb, m, n, k, lda, ldb, _ = gemm.split()
    m, n, k, lda, ldb = int(m), int(n), int(k), int(lda), int(ldb)
    # MKL's A is torch's right operand (k x m), its B the left one (n x k).
    right = (torch.zeros(k, lda)[:, :m] if ta == "N" else torch.zeros(m, lda)[:, :k].t())
    left = (torch.zeros(n, ldb)[:, :k] if tb == "N" else torch.zeros(k, ldb)[:, :n].t())
    torch.mm(left, right)


def replay(gemms: list[str]) -> dict[str, Any]:
    """MKL's buffers after the distinct ``gemms`` in their order, then largest first."""
    import torch

    torch.set_num_threads(1)
    lib = _torch_cpu()
    distinct = list(dict.fromkeys(gemms))
    size = {g: int(g.split()[2]) * int(g.split()[3]) * int(g.split()[4]) for g in distinct}
    held = {}
    for name, order in (("program order", distinct),
                        ("largest first", sorted(distinct, key=lambda g: -size[g])),
                        ("seeded", distinct)):
        lib.mkl_serv_free_buffers()
        if name == "seeded":
            if held["largest first"]["mkl_buffers"] != 1:
                break
            lib.mkl_serv_deallocate(lib.mkl_serv_allocate(held["largest first"]["mkl_bytes"], 128))
        for gemm in order:
            run_gemm(gemm)
        held[name] = _mkl_held()
    return held


def _in_child(execution: str, options: argparse.Namespace,
              stdin: str | None = None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", execution, "--model", options.model,
               "--batch", str(options.batch), "--seq", str(options.seq),
               "--calls", str(options.calls)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, input=stdin)
    if done.returncode != 0:
        raise SystemExit(f"{execution} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _first_difference(a: list[str], b: list[str]) -> str:
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"first difference at call {k}: eager {x!r}, planned {y!r}"
    return f"eager made {len(a)}, planned {len(b)} (one is a prefix of the other)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child == "replay":
        print(json.dumps(replay(json.loads(sys.stdin.read()))))
        return 0
    if options.child:
        print(json.dumps(measure(options.child, options.model, options.batch, options.seq,
                                 options.calls)))
        return 0
    if not (sys.platform == "linux" and platform.libc_ver()[0] == "glibc"):
        print("skipped: this script reads glibc's mallinfo2 and MKL's verbose log (Linux, glibc)")
        return 0
    import torch

    if not torch.backends.mkl.is_available():
        print("skipped: this torch is not built with MKL")
        return 0
    print(f"{options.model} {options.batch}x{options.seq} (base size), one thread, "
          f"{options.calls} calls after the first plan/build, torch {torch.__version__}")
    eager = _in_child("eager", options)
    planned = _in_child("planned", options)
    same = eager["gemms"] == planned["gemms"]
    print(f"\nsgemm calls: eager {len(eager['gemms'])}, planned {len(planned['gemms'])}: "
          + ("the same sequence, call for call" if same
             else _first_difference(eager["gemms"], planned["gemms"])))
    counts = [collections.Counter(r["gemms"]) for r in (eager, planned)]
    print(f"\n  {'transa transb m n k lda ldb ldc':34s} {'eager':>6s} {'planned':>7s}")
    for shape in sorted(set(counts[0]) | set(counts[1]), key=lambda s: -counts[0][s]):
        print(f"  {shape:34s} {counts[0][shape]:6d} {counts[1][shape]:7d}")
    print("\nafter the calls, above the built stage (MiB):")
    print(f"  {'':8s} {'MKL holds':>10s} {'buffers':>8s} {'glibc mmap':>11s} {'glibc heap':>11s}")
    for r in (eager, planned):
        b, a = r["before"], r["after"]
        print(f"  {r['execution']:8s} {(a['mkl_bytes'] - b['mkl_bytes']) / MIB:10.2f} "
              f"{a['mkl_buffers'] - b['mkl_buffers']:8d} {(a['mmap'] - b['mmap']) / MIB:11.2f} "
              f"{(a['heap'] - b['heap']) / MIB:11.2f}")
    held = _in_child("replay", options, stdin=json.dumps(planned["gemms"]))
    print("\nthe distinct GEMMs replayed alone, MKL's buffers after them:")
    for order, h in held.items():
        print(f"  {order:14s} {h['mkl_bytes'] / MIB:6.2f} MiB in {h['mkl_buffers']} buffers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
