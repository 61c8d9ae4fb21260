"""What a planned call's process memory is made of, beside eager's: the floor no plan can go under.

Issue 22 asks for a planned call's process peak at <= 0.8x eager's where the two live peaks tie
(the plan's arena at its bound, which is eager's live peak). This script measures, in one fresh
process per execution (``eager``, ``planned``) as ``tensorarena bench exec`` does (libraries
warmed on a tiny model first, then the full-size model and its inputs, then the baseline), the
resident memory above the baseline at each stage (built, after each call, after ``del`` and
``tensorarena.empty_cache()``) and what it is made of:

* ``anon``/``file``: anonymous and file-backed resident pages (``RssAnon``, ``RssFile``): file
  pages are the code the kernels run (GEMM, oneDNN) paged in at the first call;
* ``heap``/``in use``/``mmap``: glibc's ``mallinfo2``: the main heap's size, the bytes in use in
  it, and the blocks glibc mapped by ``mmap`` (large ``malloc`` blocks that stay: the kernels'
  own caches and scratch);
* ``mkl``: the bytes MKL's memory manager holds (``mkl_serv_mem_stat``: its sgemm packing
  buffers, kept for the process), wherever glibc put them (``bench/gemm_buffers.py``);
* ``h rss``: the main heap's resident pages (``/proc/self/smaps``): its size less the free pages
  ``malloc_trim`` gave back;
* ``arenas``: the interpreter's small-object arenas (pymalloc's, 1 MiB each on 64-bit Python
  3.10+), a count: a few live objects keep a whole arena resident;
* ``peak``: the most resident during each call (``VmHWM`` reset before it); the last call's is
  the steady one (``tensorarena bench exec`` measures calls after a planning call and a warm-up);
* the build's wall time (for ``planned``: the export in its child and the read-back);
* with ``--rebuilds 1`` (the default), the same model is then built, called and deleted once
  more: where the second ``del`` leaves the process beside where the first one did tells what a
  program leaves behind from what the process's first build pays once (imports, torch's
  operator tables, the interpreter arenas they keep, code pages).

The last lines put the two side by side: the planned call's peak over eager's, and the *floor*:
the planned arena plus what eager's own call keeps resident for the kernels (the ``malloc``
blocks still allocated after it, glibc ``mmap`` blocks and bytes in use in the heap, and code
pages, which the same kernels keep in the planned process too), over eager's peak. Both kinds of
block count: MKL asks for the same buffers in both processes, and glibc maps the large ones with
``mmap`` or carves them from its heap depending on whether a large block was freed before (its
mmap threshold moves up then), which varies from run to run in eager's process.
A floor above 0.8 says the target cannot be met by any plan on this model and machine.

    .venv/bin/python bench/process_floor.py [--model gpt2] [--batch 1] [--seq 128] [--calls 3]

Linux with glibc only (``/proc/self/status``, ``mallinfo2``); elsewhere it says so and exits.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

MIB = 1 << 20
FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
          "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS]


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def _mkl_bytes() -> Any:
    """A function that returns the bytes MKL's memory manager holds (0 without MKL)."""
    from tensorarena.interop.mkl_buffers import held

    return lambda: (now.bytes if (now := held()) is not None else 0)


def _heap_resident() -> int:
    """The main heap's resident bytes (its ``[heap]`` mapping's ``Rss``): ``mallinfo2`` gives
    its extent, which counts free pages ``malloc_trim`` already gave back."""
    resident, in_heap = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                in_heap = line.rstrip().endswith("[heap]")
            elif in_heap and line.startswith("Rss:"):
                resident += int(line.split()[1]) * 1024
    return resident


def _python_arenas() -> int:
    """The interpreter's small-object arenas in use (``sys._debugmallocstats``, which writes to
    the C ``stderr``); 0 where it says nothing of them."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as text:
        os.dup2(text.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        text.seek(0)
        found = re.search(rb"# arenas allocated current\s*=\s*([\d,]+)", text.read())
    return int(found.group(1).replace(b",", b"")) if found else 0


def _sample(libc: Any, mkl: Any) -> dict[str, int]:
    gc.collect()
    info = libc.mallinfo2()
    return {**_status(), "heap": info.arena, "in_use": info.uordblks, "mmap": info.hblkhd,
            "mkl": mkl(), "heap_rss": _heap_resident(), "arenas": _python_arenas()}


def measure(execution: str, model_name: str, batch: int, seq: int | None, calls: int,
            rebuilds: int = 1) -> dict[str, Any]:
    """One execution's stages, in this process (the child's side): built, its calls, deleted;
    then, ``rebuilds`` times, the same again (what a process's first build pays once, such as
    imports and the interpreter's arenas, is then paid already)."""

    import tensorarena
    from tensorarena.bench import process_memory
    from tensorarena.bench.exec_executions import build_execution, measured_model

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    mkl = _mkl_bytes()
    model, args, kwargs = measured_model(execution, model_name, batch=batch, seq=seq)
    stages: list[dict[str, Any]] = [{"stage": "baseline", **_sample(libc, mkl)}]
    seconds, arena = 0.0, 0
    for label in ("", " again")[:1 + rebuilds]:
        started = time.perf_counter()
        built = build_execution(execution, model, args, kwargs, training=False)
        seconds = seconds or time.perf_counter() - started
        stages.append({"stage": f"built{label}", **_sample(libc, mkl)})
        for k in range(calls):
            process_memory.reset_peak()
            out = built.call()
            peak = process_memory.peak_rss() or 0
            del out
            built.drop()
            stages.append({"stage": f"call {k + 1}{label}", **_sample(libc, mkl), "peak": peak})
        arena = built.arena_bytes
        del built
        gc.collect()
        tensorarena.empty_cache()
        stages.append({"stage": f"del + empty_cache{label}", **_sample(libc, mkl)})
    return {"execution": execution, "arena": arena, "stages": stages, "build_seconds": seconds}


def child_command(execution: str, options: argparse.Namespace) -> list[str]:
    """The command line of the child that measures ``execution``: ``--seq`` only where one was
    given (a model of images or audio takes none; a token model then has its own default)."""
    command = [sys.executable, __file__, "--child", execution, "--model", options.model,
               "--batch", str(options.batch), "--calls", str(options.calls),
               "--rebuilds", str(options.rebuilds)]
    if options.seq is not None:
        command += ["--seq", str(options.seq)]
    return command


def _in_child(execution: str, options: argparse.Namespace) -> dict[str, Any]:
    command = child_command(execution, options)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{execution} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _print(result: dict[str, Any]) -> None:
    stages = result["stages"]
    base = stages[0]
    print(f"\n{result['execution']} (arena {result['arena'] / MIB:.1f} MiB, built in "
          f"{result['build_seconds']:.2f} s), MiB above the baseline:")
    print(f"  {'stage':18s} {'rss':>6s} {'peak':>6s} {'anon':>6s} {'file':>6s} {'heap':>6s} "
          f"{'in use':>6s} {'mmap':>6s} {'mkl':>6s} {'h rss':>6s} {'arenas':>6s}")
    for row in stages:
        peak = f"{(row['peak'] - base['VmRSS']) / MIB:6.1f}" if "peak" in row else " " * 6
        cells = [(row[key] - base[key]) / MIB for key in
                 ("VmRSS", "RssAnon", "RssFile", "heap", "in_use", "mmap", "mkl", "heap_rss")]
        print(f"  {row['stage']:18s} {cells[0]:6.1f} {peak} " +
              " ".join(f"{c:6.1f}" for c in cells[1:]) +
              f" {row['arenas'] - base['arenas']:+6d}")


def _peak(result: dict[str, Any], *, first: bool = False) -> int:
    """The peak of the first call (which plans what was left) or of the last (steady)."""
    base = result["stages"][0]["VmRSS"]
    calls = [row["peak"] for row in _first_cycle(result) if "peak" in row]
    return (calls[0] if first else calls[-1]) - base


def _first_cycle(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages of the first program, from the baseline to its last call (all but the last
    stage where no stage is named ``del + empty_cache``)."""
    stages = result["stages"]
    ends = [i for i, row in enumerate(stages) if row.get("stage") == "del + empty_cache"]
    return stages[:ends[0] if ends else -1]


def _first_del(result: dict[str, Any]) -> int:
    """The resident bytes after the first program was deleted (``empty_cache()`` called)."""
    return next(row["VmRSS"] for row in result["stages"] if row["stage"] == "del + empty_cache")


def kept_by_kernels(result: dict[str, Any]) -> int:
    """What eager's last call left resident for the kernels: the ``malloc`` blocks still
    allocated (glibc mmap blocks and bytes in use in its heap: MKL's buffers are in one or the
    other, module docstring) and code pages."""
    base, last = result["stages"][0], _first_cycle(result)[-1]
    return sum(last[key] - base[key] for key in ("mmap", "in_use", "RssFile"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=None,
                        help="tokens per item (default: the model's own; none for images/audio)")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--rebuilds", type=int, choices=(0, 1), default=1,
                        help="build, call and delete the program once more (default 1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        print(json.dumps(measure(options.child, options.model, options.batch, options.seq,
                                 options.calls, options.rebuilds)))
        return 0
    if not (sys.platform == "linux" and platform.libc_ver()[0] == "glibc"):
        print("skipped: this script reads /proc/self/status and glibc's mallinfo2 (Linux, glibc)")
        return 0
    shape = f"{options.batch}x{options.seq}" if options.seq is not None else str(options.batch)
    print(f"{options.model} {shape} (base size), one thread, "
          f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    eager = _in_child("eager", options)
    planned = _in_child("planned", options)
    for result in (eager, planned):
        _print(result)
    eager_peak, planned_peak = _peak(eager), _peak(planned)
    floor = planned["arena"] + kept_by_kernels(eager)
    print(f"\npeak during the last call: eager {eager_peak / MIB:.1f} MiB, planned "
          f"{planned_peak / MIB:.1f} MiB: planned/eager {planned_peak / eager_peak:.2f} "
          f"(first calls: {_peak(eager, first=True) / MIB:.1f}, "
          f"{_peak(planned, first=True) / MIB:.1f} MiB)")
    print(f"floor = planned arena {planned['arena'] / MIB:.1f} MiB + what eager's kernels keep "
          f"resident {kept_by_kernels(eager) / MIB:.1f} MiB = {floor / MIB:.1f} MiB: "
          f"floor/eager {floor / eager_peak:.2f}")
    after = [_first_del(result) - result["stages"][0]["VmRSS"] for result in (eager, planned)]
    print(f"after del + empty_cache: eager {after[0] / MIB:.1f} MiB, planned "
          f"{after[1] / MIB:.1f} MiB (planned - eager {(after[1] - after[0]) / MIB:+.1f} MiB)")
    if options.rebuilds:
        again = [result["stages"][-1]["VmRSS"] - _first_del(result) for result in (eager, planned)]
        print(f"a second build, its calls, del + empty_cache: from where the first del left "
              f"it, eager {again[0] / MIB:+.1f} MiB, planned {again[1] / MIB:+.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
