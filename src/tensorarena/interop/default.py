"""The process-wide default resource behind ``tensorarena.empty``: a thread-safe pool over mmap.

Created lazily on first use, so ``import tensorarena`` maps nothing. The default is

    ThreadCached(ThreadSafe(Pool(HostMemory(huge_pages=True), initial_size=DEFAULT_INITIAL_SIZE)))

Arrays reuse pages the pool already faulted in instead of paying a system call and a page fault
per page for every large array, which is where ``np.empty`` spends its time (see ``tensorarena
bench reuse``). Huge pages cut the first-touch cost of the arenas themselves (one fault per
2 MiB). The per-thread caches serve small blocks (up to 1 MiB) without taking the pool's lock:
that halves the cost of a small array, where ``np.empty`` (glibc's heap) is hard to beat.

``set_default_resource`` swaps it for any resource (and returns the previous one, so tests and
libraries can restore it); arrays already made keep the resource they came from.
"""

from __future__ import annotations

import threading

from tensorarena.memory.resource import MemoryResource

__all__ = ["DEFAULT_INITIAL_SIZE", "default_resource", "set_default_resource"]

#: Bytes the default pool maps up front (it grows on demand beyond this).
DEFAULT_INITIAL_SIZE = 8 * 1024 * 1024

_lock = threading.Lock()
_default: MemoryResource | None = None


def _make_default() -> MemoryResource:
    from tensorarena.adaptors import ThreadCached, ThreadSafe
    from tensorarena.memory.host import HostMemory
    from tensorarena.memory.pool import Pool

    pool = Pool(HostMemory(huge_pages=True), initial_size=DEFAULT_INITIAL_SIZE)
    return ThreadCached(ThreadSafe(pool))


def default_resource() -> MemoryResource:
    """The resource ``empty``/``zeros`` use when given none (created on first call)."""
    resource = _default
    if resource is not None:
        return resource
    return _create_default()


def _create_default() -> MemoryResource:
    global _default
    with _lock:
        if _default is None:
            _default = _make_default()
        return _default


def set_default_resource(resource: MemoryResource | None) -> MemoryResource | None:
    """Make ``resource`` the default and return the previous one (``None``: recreate lazily).

    Raises :class:`TypeError` for an object that is not a memory resource.
    """
    global _default
    if resource is not None and not (
        callable(getattr(resource, "allocate", None))
        and callable(getattr(resource, "deallocate", None))
    ):
        raise TypeError(f"not a memory resource (allocate/deallocate): {type(resource).__name__}")
    with _lock:
        previous, _default = _default, resource
    return previous
