"""MKL's GEMM packing buffers, kept for the process: several made one, or all given back.

MKL's memory manager keeps the packing buffers its ``sgemm`` takes (their size follows ``m``,
``n``, ``k``) for the rest of the process, and serves a request from the smallest free buffer
it holds that is large enough, allocating a new one only when none is. How many it keeps so
follows the order of the first calls: GPT-2 takes a buffer at its first QKV projection, a
larger one at its first MLP, a larger one again at its LM head, and keeps all three, where the
last alone would serve every call (the sizes: ``bench/gemm_buffers.py`` and
``bench/RESULTS.md``). A planned call runs the same GEMMs as eager, so MKL keeps the same
buffers in both processes; this module lets a process keep only the largest.

:func:`consolidate` does it between calls with MKL's own service functions, exported by
``libtorch_cpu.so``: it holds every buffer but one with small requests (the smallest free ones
come back, so the one left free is the largest), frees the free one to learn its size
(``mkl_serv_free_buffers``, ``mkl_serv_mem_stat``), hands the others back and frees them, then
takes and returns one buffer of that size, which MKL keeps. Where the counts do not move as
that expects (a buffer in use, another MKL), it stops: no buffer in use is freed, a free one it
has freed MKL allocates again when a call needs it, and the small requests' few bytes may stay
cached. MKL keeps a cache per thread and ``mkl_serv_mem_stat`` counts them all, so it runs only
with one intra-op thread (``torch.get_num_threads() == 1``) and while no other Python thread
runs (tqdm's progress monitor aside, :mod:`~tensorarena.interop.other_threads`): with more,
the other threads' buffers could not be told from this one's. Results are not touched: the
buffers are scratch.
Without MKL (another BLAS, another platform) it does nothing and says so (``None``).

:func:`release` gives every free buffer back (``mkl_serv_free_buffers``, MKL's
``mkl_free_buffers``) under the same two rules; ``tensorarena.empty_cache()`` calls it, so that
after a model or a planned program is deleted MKL keeps no packing buffer (eager's GPT-2 keeps
9.2 MiB, a planned one its largest, 4.9 MiB). The next GEMM allocates what it needs again.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Any

from tensorarena.interop.other_threads import other_threads

__all__ = ["MklBuffers", "consolidate", "held", "release"]

#: The alignment MKL's sgemm asks its buffers with.
ALIGNMENT = 128


@dataclass(frozen=True)
class MklBuffers:
    """What MKL's memory manager holds: bytes and buffers (in use or cached)."""

    bytes: int
    buffers: int


_SERVICE: list[Any] = []  # [library or None], loaded once


def _service() -> Any:
    if not _SERVICE:
        _SERVICE.append(_load())
    return _SERVICE[0]


def _load() -> Any:
    try:
        import torch

        if not torch.backends.mkl.is_available():  # type: ignore[no-untyped-call]
            return None
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib",
                                       "libtorch_cpu.so"))
        stat, allocate = lib.mkl_serv_mem_stat, lib.mkl_serv_allocate
        deallocate, free = lib.mkl_serv_deallocate, lib.mkl_serv_free_buffers
    except (ImportError, OSError, AttributeError):
        return None
    stat.restype, stat.argtypes = ctypes.c_int64, [ctypes.POINTER(ctypes.c_int)]
    allocate.restype, allocate.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int]
    deallocate.restype, deallocate.argtypes = None, [ctypes.c_void_p]
    free.restype, free.argtypes = None, []
    return lib


def held() -> MklBuffers | None:
    """What MKL's memory manager holds now, or ``None`` where torch's MKL is not reachable."""
    lib = _service()
    if lib is None:
        return None
    buffers = ctypes.c_int(0)
    nbytes = lib.mkl_serv_mem_stat(ctypes.byref(buffers))
    return MklBuffers(int(nbytes), buffers.value)


def consolidate() -> MklBuffers | None:
    """Leave MKL with one buffer, the largest it holds, where it holds several, none is in use
    and torch runs one intra-op thread (module docstring); return what it holds then (``None``
    without MKL). Call it between calls, from the thread that runs the GEMMs; it never frees a
    buffer in use."""
    lib = _service()
    before = held()
    if lib is None or before is None or before.buffers <= 1 or not _alone():
        return before
    taken = []
    try:
        for _ in range(before.buffers - 1):
            pointer = lib.mkl_serv_allocate(1, ALIGNMENT)
            if not pointer:
                return held()
            taken.append(pointer)
        if held() != before:  # a small request got a new buffer: one was in use
            return held()
        lib.mkl_serv_free_buffers()
        after = held()
        if after is None or after.buffers != before.buffers - 1:
            return held()
        largest = before.bytes - after.bytes
    finally:
        for pointer in taken:
            lib.mkl_serv_deallocate(pointer)
    lib.mkl_serv_free_buffers()
    # MKL counts a few bytes of its own beside a request: asking for the whole size it held
    # keeps a buffer at least as large as the one freed
    pointer = lib.mkl_serv_allocate(largest, ALIGNMENT)
    if pointer:
        lib.mkl_serv_deallocate(pointer)
    return held()


def release() -> MklBuffers | None:
    """Give back every buffer MKL holds free, where torch runs one intra-op thread and no
    other Python thread runs (module docstring); return what it holds then (``None`` without
    MKL, or while torch is not imported: then nothing ran MKL through it). A buffer in use is
    never freed (MKL frees only free ones); call it between calls."""
    if "torch" not in sys.modules:
        return None
    lib = _service()
    before = held()
    if lib is None or before is None or before.buffers == 0 or not _alone():
        return before
    lib.mkl_serv_free_buffers()
    return held()


def _alone() -> bool:
    """One intra-op thread and no other Python thread (tqdm's monitor aside): no other thread
    can be inside MKL, whose counts and caches are the process's."""
    import torch

    return torch.get_num_threads() == 1 and not other_threads()
