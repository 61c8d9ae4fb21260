"""``empty_cache()``: give back the memory nothing uses, as ``torch.cuda.empty_cache`` does.

A pool keeps the arenas it mapped after their blocks are freed, and a thread cache keeps freed
small blocks for the next request of their size: that is what makes them fast, and it is also
memory the process keeps. :func:`empty_cache` gives it back, layer by layer down a resource's
stack (default: the default resource of ``tensorarena.empty``, where planned programs' arenas
come from): every thread cache is flushed, then every pool gives back its empty arenas
(:meth:`~tensorarena.memory.Pool.trim`). It never touches a live block (RMM's ownership rule):
an arena with one live block stays mapped.

Two steps before and after that make it do what a user deleting a model or a planned program
means by it:

* garbage is collected first, so blocks held only by unreachable objects (reference cycles,
  such as generated code that refers to itself) come back before the pools are trimmed;
* MKL's cached GEMM packing buffers go back (:func:`~tensorarena.interop.mkl_buffers.release`,
  MKL's ``mkl_free_buffers``; a few MiB, kept for the process otherwise, by eager calls and
  planned ones alike), only where torch is imported, runs one intra-op thread and no other
  Python thread runs (tqdm's progress monitor aside): with more, another thread could be inside
  MKL. A buffer in use is never freed; the next GEMM allocates what it needs again;
* the idle memory of planned programs goes back page by page: a program keeps its arena between
  calls (its code is generated over those addresses), but nothing in it is read before the next
  call writes it, so the pages of every workspace no call is using (and of a handed-over tail
  the caller no longer holds) are given back (:mod:`~tensorarena.memory.idle_pages`) while the
  addresses stay reserved; the next call faults them in again, zeroed. Those bytes stay counted
  as the pool's (the block is still allocated) and are not in the returned total;
* on Linux with glibc, the C heap is trimmed last (``malloc_trim(0)``): torch's CPU tensors and
  every C extension's small allocations live there, and glibc keeps freed pages of its heap
  resident until told otherwise.

Like the C heap's trim, MKL's release is the process's, whichever ``resource`` is given.
"""

from __future__ import annotations

import gc
import weakref
from typing import Protocol

from tensorarena.interop.default import default_resource
from tensorarena.interop.mkl_buffers import release as release_mkl_buffers
from tensorarena.memory import libc
from tensorarena.memory.resource import MemoryResource, check_resource, resource_stack

__all__ = ["IdleMemory", "empty_cache", "hold_idle_memory", "trim_c_heap", "trim_pools"]


class IdleMemory(Protocol):
    """Memory reserved for later use that :func:`empty_cache` may hand back page by page."""

    #: where its blocks come from (``None``: the default resource)
    resource: MemoryResource | None

    def release_idle_pages(self) -> int:
        """Give back the pages of the blocks nothing uses now; return the bytes."""


_IDLE: weakref.WeakSet[IdleMemory] = weakref.WeakSet()


def hold_idle_memory(holder: IdleMemory) -> None:
    """Have :func:`empty_cache` call ``holder.release_idle_pages()`` while ``holder`` lives,
    when its resource is in the stack being emptied (a planned program's workspace)."""
    _IDLE.add(holder)


def empty_cache(resource: MemoryResource | None = None) -> int:
    """Give back every cached block and empty arena of ``resource`` (default: the default
    resource), MKL's free GEMM buffers and the C heap's free pages; return the bytes the pools
    gave back (module docstring). Raises :class:`~tensorarena.errors.InvalidResourceError`
    for an object that is not a resource."""
    stack = _stack(resource)
    gc.collect()
    _release_idle(stack)
    for layer in stack:
        flush_all = getattr(layer, "flush_all", None)
        if callable(flush_all):
            flush_all()
    released = _trim(stack)
    release_mkl_buffers()
    trim_c_heap()
    return released


def trim_c_heap() -> bool:
    """Give the C heap's free pages back to the kernel (glibc's ``malloc_trim(0)``: torch's CPU
    tensors live there); return whether any went. False off Linux or without glibc. What a
    planned program calls after the call that recorded its kernels' allocations, an eager-like
    run whose temporaries glibc would otherwise keep resident beside the arena."""
    return libc.available() and libc.malloc_trim()


def trim_pools(resource: MemoryResource | None = None) -> int:
    """Give back the empty arenas of every pool in ``resource``'s stack (default: the default
    resource), leaving thread caches and the C heap alone; return the bytes given back. What
    a planned program calls when it replaced its arena by a larger one, so that the old one,
    now empty, is not kept beside it."""
    return _trim(_stack(resource))


def _release_idle(stack: list[object]) -> int:
    """Have every held :class:`IdleMemory` whose resource is in ``stack`` give its idle pages
    back; return the bytes."""
    default = default_resource()
    ids = {id(layer) for layer in stack}
    return sum(holder.release_idle_pages() for holder in list(_IDLE)
               if id(holder.resource if holder.resource is not None else default) in ids)


def _stack(resource: MemoryResource | None) -> list[object]:
    return list(resource_stack(check_resource(
        default_resource() if resource is None else resource)))


def _trim(stack: list[object]) -> int:
    released = 0
    for layer in stack:
        trim = getattr(layer, "trim", None)
        if callable(trim):
            released += int(trim())
    return released
