"""The process-wide default resource behind ``tensorarena.empty``: a thread-cached pool over mmap.

Created lazily on first use, so ``import tensorarena`` maps nothing. The default is

    ThreadCached(Pool(HostMemory(huge_pages=True), growth=Segments(),
                      initial_size=DEFAULT_INITIAL_SIZE))

A large request (1 MiB or more) that fits in no arena gets an arena of its own, rounded up to
2 MiB (:class:`~tensorarena.memory.growth.Segments`, as PyTorch's caching allocator sizes its
segments): a planned program's arena costs its size, not the next power of two, and goes back
whole with :func:`~tensorarena.interop.empty_cache.empty_cache` once freed.

Arrays reuse pages the pool already faulted in instead of paying a system call and a page fault
per page for every large array, which is where ``np.empty`` spends its time (see ``tensorarena
bench reuse``). Huge pages cut the first-touch cost of the arenas themselves (one fault per
2 MiB). The per-thread caches serve small blocks (up to 1 MiB) without taking the pool's lock:
that halves the cost of a small array, where ``np.empty`` (glibc's heap) is hard to beat. The
pool is thread-safe itself (its lock also serves ``statistics()`` and ``memory_summary()``
from any thread).

``set_default_resource`` swaps it for any host-accessible resource (and returns the previous
one, so tests and libraries can restore it); arrays already made keep the resource they came
from, and keep it alive.
"""

from __future__ import annotations

import threading

from tensorarena.errors import NotHostAccessibleError
from tensorarena.memory.resource import MemoryResource, check_resource
from tensorarena.memory_kind import memory_kind_of

__all__ = [
    "DEFAULT_INITIAL_SIZE",
    "check_host_accessible",
    "default_resource",
    "default_resource_if_made",
    "set_default_resource",
]

#: Bytes the default pool maps up front (it grows on demand beyond this).
DEFAULT_INITIAL_SIZE = 8 * 1024 * 1024

_lock = threading.Lock()
_default: MemoryResource | None = None


def check_host_accessible(resource: object, *, name: str = "resource") -> MemoryResource:
    """Return ``resource`` if arrays may be built over its memory, else raise.

    :class:`~tensorarena.errors.InvalidResourceError` for something that is not a resource;
    :class:`~tensorarena.errors.NotHostAccessibleError` for device memory, for bookkeeping and
    address space only (an ``Arena``, ``VirtualMemory``), and for a resource that does not
    declare its ``memory_kind``: an array over such addresses would crash the process.
    """
    checked = check_resource(resource, name=name)
    kind = memory_kind_of(checked)
    if kind is None:
        raise NotHostAccessibleError(
            f"{type(resource).__name__} does not declare what its addresses are: give it a "
            "`memory_kind` attribute (tensorarena.MemoryKind.HOST for memory the CPU may touch)"
        )
    if not kind.host_accessible:
        what = {
            "device": "device memory, which the CPU must not touch",
            "address_space": "addresses only, with no bytes behind them",
        }[kind.value]
        raise NotHostAccessibleError(
            f"cannot build arrays over {type(resource).__name__}: its memory is {what} "
            f"(memory_kind={kind.name}). Use a resource over host memory, e.g. "
            "Pool(HostMemory())"
        )
    return checked


def _make_default() -> MemoryResource:
    from tensorarena.adaptors import ThreadCached
    from tensorarena.memory.growth import Segments
    from tensorarena.memory.host import HostMemory
    from tensorarena.memory.pool import Pool

    return ThreadCached(Pool(HostMemory(huge_pages=True), growth=Segments(),
                             initial_size=DEFAULT_INITIAL_SIZE))


def default_resource() -> MemoryResource:
    """The resource ``empty``/``zeros`` use when given none (created on first call)."""
    resource = _default
    if resource is not None:
        return resource
    return _create_default()


def default_resource_if_made() -> MemoryResource | None:
    """The default resource, or None while nothing has asked for it (it is not made here)."""
    return _default


def _create_default() -> MemoryResource:
    global _default
    with _lock:
        if _default is None:
            _default = _make_default()
        return _default


def set_default_resource(resource: MemoryResource | None) -> MemoryResource | None:
    """Make ``resource`` the default and return the previous one (``None``: recreate lazily).

    Raises :class:`~tensorarena.errors.InvalidResourceError` for an object that is not a memory
    resource and :class:`~tensorarena.errors.NotHostAccessibleError` for one whose memory the
    CPU cannot touch (the default resource is where arrays come from).
    """
    global _default
    if resource is not None:
        check_host_accessible(resource)
    with _lock:
        previous, _default = _default, resource
    return previous
