"""Baselines: the system's allocators (glibc, jemalloc, mimalloc) replaying the same trace.

Each runs in a child process of its own, so that its heap starts empty, nothing it keeps leaks
into ours, and its footprint can be read from the kernel: the child resets its resident-set
high-water mark (``/proc/self/clear_refs``), replays the trace calling the library's
``malloc``/``free`` through ctypes, and reports the growth of its resident set at the peak
(``VmHWM``) and at the end (``VmRSS``) over what it held before. Every allocation is touched —
one byte written in each of its pages — so that the time includes the page faults a real tensor
would take, and the pages count as resident, as a tensor's would. (Our pools replay over
:class:`~tensorarena.memory.VirtualMemory` and touch nothing: their time is bookkeeping alone.)

glibc's ``malloc`` is called in a plain child. jemalloc and mimalloc are loaded with
``LD_PRELOAD`` (jemalloc cannot be ``dlopen``'d: its thread-local storage model needs the
initial TLS block), so in those children Python's own small objects live in that allocator too;
their growth during the replay (a dict of the live allocations) is counted with the trace's and
is small beside it. A library that is not installed is skipped with the reason (Debian:
``apt-get install libjemalloc2 libmimalloc2.0``). Linux only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from tensorarena.errors import SystemAllocatorUnavailableError
from tensorarena.trace._text import Source, is_path
from tensorarena.trace.csv_format import write_csv
from tensorarena.trace.formats import read_all
from tensorarena.trace.model import ALLOC, Event, Trace
from tensorarena.trace.replay import ReplayResult

__all__ = ["SYSTEM_ALLOCATORS", "SystemAllocatorUnavailableError", "replay_system",
           "system_allocator_library"]

#: name -> (library names to look for, whether it must be preloaded)
SYSTEM_ALLOCATORS: dict[str, tuple[tuple[str, ...], bool]] = {
    "glibc": (("libc.so.6",), False),
    "jemalloc": (("libjemalloc.so.2", "libjemalloc.so"), True),
    "mimalloc": (("libmimalloc.so.2", "libmimalloc.so.2.0", "libmimalloc.so"), True),
}
_PACKAGES = {"jemalloc": "libjemalloc2", "mimalloc": "libmimalloc2.0"}
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                 "/usr/lib", "/usr/local/lib", "/lib/x86_64-linux-gnu")
_CHILD_TIMEOUT = 3600.0


def system_allocator_library(name: str) -> str:
    """The path (or soname) of ``name``'s library, or raise
    :class:`~tensorarena.errors.SystemAllocatorUnavailableError`."""
    if name not in SYSTEM_ALLOCATORS:
        raise SystemAllocatorUnavailableError(f"unknown system allocator {name!r}; known: "
                                         f"{', '.join(SYSTEM_ALLOCATORS)}")
    if not sys.platform.startswith("linux"):
        raise SystemAllocatorUnavailableError(f"{name}: the system baselines run on Linux only")
    names, _ = SYSTEM_ALLOCATORS[name]
    for folder in _LIBRARY_DIRS:
        for soname in names:
            candidate = Path(folder) / soname
            if candidate.exists():
                return str(candidate)
    found = ctypes.util.find_library("c" if name == "glibc" else name)
    if found:
        return found
    package = _PACKAGES.get(name)
    hint = f" (Debian: apt-get install {package})" if package else ""
    raise SystemAllocatorUnavailableError(f"{name} is not installed{hint}")


def replay_system(source: Trace | Source | Iterable[Event], name: str, *,
                  timeout: float = _CHILD_TIMEOUT) -> ReplayResult:
    """Replay ``source`` on the system allocator ``name`` in a child process (see above)."""
    library = system_allocator_library(name)
    _, preload = SYSTEM_ALLOCATORS[name]
    with tempfile.TemporaryDirectory(prefix="tensorarena-replay-") as folder:
        if is_path(source):
            path = str(source)
        else:
            path = os.path.join(folder, "trace.csv")
            write_csv(read_all(source), path)
        env = dict(os.environ)
        if preload:
            env["LD_PRELOAD"] = library
        if name == "mimalloc":  # purge freed pages at once, not after a delay (mimalloc >= 2.1;
            env.setdefault("MIMALLOC_PURGE_DELAY", "0")  # older releases read RESET_DELAY)
            env.setdefault("MIMALLOC_RESET_DELAY", "0")
        command = [sys.executable, "-m", "tensorarena.trace.system", library, path]
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise SystemAllocatorUnavailableError(f"{name}: the replay took over {timeout:g} s"
                                             ) from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemAllocatorUnavailableError(f"{name}: the replay failed: {last}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return ReplayResult(name=name, upstream_allocs=None, upstream_frees=None,
                        fragmentation=None, **data)


# --- the child -------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def _give_back_free_pages(lib: ctypes.CDLL) -> None:
    """Ask the allocator to return its free pages to the kernel, so that the replay starts from
    no resident free memory: pages the interpreter freed before it would otherwise serve the
    trace without showing in the resident set (a small trace then looked smaller than its live
    bytes). glibc: ``malloc_trim``; jemalloc: purge every arena; mimalloc: ``mi_collect``."""
    if hasattr(lib, "mi_collect"):
        lib.mi_collect.argtypes = [ctypes.c_bool]
        lib.mi_collect(True)
    elif hasattr(lib, "mallctl"):
        lib.mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_size_t]
        lib.mallctl(b"arena.4096.purge", None, None, None, 0)  # 4096: MALLCTL_ARENAS_ALL
    if hasattr(lib, "malloc_trim"):  # glibc's heap also serves the interpreter under a preload
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        lib.malloc_trim(0)


def _child(library: str, path: str) -> dict[str, object]:
    import numpy as np

    from tensorarena.trace.formats import iter_events

    lib = ctypes.CDLL(library)
    malloc, free = lib.malloc, lib.free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    memset, c_ubyte = ctypes.memset, ctypes.c_uint8
    as_array = np.ctypeslib.as_array
    events = list(iter_events(path))  # held, so that reading is not timed or counted
    live: dict[int, int] = {}
    failed: set[int] = set()
    _give_back_free_pages(lib)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")  # reset the high-water mark of the resident set
    before = _status_kib("VmRSS")
    level = peak = failures = 0
    began = time.perf_counter()
    for op, ident, nbytes, *_ in events:
        if op == ALLOC:
            level += nbytes
            peak = max(peak, level)
            address = malloc(nbytes)
            if not address:
                failures += 1
                failed.add(ident)
                continue
            if nbytes <= page:
                memset(address, 1, 1)
            else:
                as_array((c_ubyte * nbytes).from_address(address))[::page] = 1
            live[ident] = address
        else:
            level -= nbytes
            if ident in failed:
                failed.discard(ident)
                continue
            free(live.pop(ident))
    seconds = time.perf_counter() - began
    end = _status_kib("VmRSS")
    high = _status_kib("VmHWM")
    for address in live.values():
        free(address)
    allocations = sum(1 for e in events if e[0] == ALLOC)
    return {"events": len(events), "allocations": allocations,
            "frees": len(events) - allocations, "failures": failures, "peak_live_bytes": peak,
            "end_live_bytes": level, "peak_reserved_bytes": max(high - before, 0) * 1024,
            "end_reserved_bytes": max(end - before, 0) * 1024, "seconds": seconds}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2])))
