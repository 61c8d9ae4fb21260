"""CuPy's allocations routed through tensorarena: ``cupy.cuda.set_allocator`` and the pinned one.

CuPy asks its current allocator for ``size`` bytes and expects a ``cupy.cuda.MemoryPointer``
back; the pointer's memory object lives as long as any array over it. :class:`CupyAllocator`
takes the bytes from a tensorarena resource (default: the current device's stream-ordered pool,
:func:`~tensorarena.interop.stream_pools.stream_ordered_pool`, as CuPy's own pool is
stream-ordered) and wraps them
in ``cupy.cuda.UnownedMemory`` whose *owner* is a small block object: when CuPy drops the last
array, the owner dies and gives the block back, ordered on the CuPy stream that was current when
the block was allocated (a stream-ordered pool then holds it until that stream's work is done),
with the block's device current (the garbage collector may run on any device).
:class:`CupyPinnedAllocator` does the same for ``cupy.cuda.set_pinned_memory_allocator`` with
the process's pinned pool.

``use_with_cupy()`` installs both for the length of a ``with`` block and puts CuPy's own back
after. CuPy is imported when an allocator is made (the ``cupy`` module may also be passed in,
which is how the tests run these classes without a GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tensorarena._optional import require
from tensorarena.interop.device_arrays import device_of
from tensorarena.memory.cuda.current import block_device
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream, check_resource

__all__ = ["CupyAllocator", "CupyPinnedAllocator", "use_with_cupy"]


def _cupy(module: Any) -> Any:
    if module is not None:
        return module
    return require("cupy", extra="cupy", feature="the CuPy allocator hooks")


class _Block:
    """One block handed to CuPy; gives it back when CuPy's memory object lets go of it."""

    __slots__ = ("device", "nbytes", "ptr", "resource", "size", "stream")

    def __init__(self, resource: MemoryResource, address: int, nbytes: int, stream: Stream,
                 device: int | None = None):
        self.device = device
        self.resource = resource
        self.ptr = address  # the attribute names CuPy's pinned pointer reads
        self.size = nbytes
        self.nbytes = nbytes
        self.stream = stream

    def __del__(self) -> None:
        with block_device(self.device):
            self.resource.deallocate(self.ptr, self.nbytes, self.stream)


class _Hook:
    """What both allocators share: the resource (given, or the process's default for the
    kind of memory) and the CuPy module."""

    def __init__(self, resource: MemoryResource | None = None, *, cupy: Any = None) -> None:
        self._cupy = _cupy(cupy)
        self._resource = None if resource is None else check_resource(resource, name="resource")

    @property
    def resource(self) -> MemoryResource:
        """The resource blocks come from."""
        return self._resource if self._resource is not None else self._default()

    def _default(self) -> MemoryResource:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._resource!r})"


class CupyAllocator(_Hook):
    """A ``cupy.cuda.set_allocator`` allocator over a tensorarena resource (default: the
    current device's stream-ordered pool)."""

    def __init__(self, resource: MemoryResource | None = None, *, cupy: Any = None) -> None:
        super().__init__(resource, cupy=cupy)
        # A given resource's layers never change (each adaptor's upstream is read-only), so
        # its device is found once rather than by walking the stack at every allocation. The
        # default pool is the current device's, looked up at each call.
        self._device = None if self._resource is None else device_of(self._resource)

    def _default(self) -> MemoryResource:
        from tensorarena.interop.stream_pools import stream_ordered_pool

        return stream_ordered_pool()

    def __call__(self, size: int) -> Any:
        """``size`` bytes as a ``cupy.cuda.MemoryPointer``."""
        cuda = self._cupy.cuda
        if self._resource is not None:
            resource, device = self._resource, self._device
        else:
            resource = self._default()
            device = device_of(resource)
        nbytes = max(int(size), 1)
        stream = cuda.get_current_stream().ptr
        address = resource.allocate(nbytes, DEFAULT_ALIGNMENT, stream)
        if device is None:
            device = cuda.Device().id
        owner = _Block(resource, address, nbytes, stream, device)
        memory = cuda.UnownedMemory(address, nbytes, owner, device)
        return cuda.MemoryPointer(memory, 0)


class CupyPinnedAllocator(_Hook):
    """A ``cupy.cuda.set_pinned_memory_allocator`` allocator over a pinned resource (default:
    the process's pinned pool)."""

    def _default(self) -> MemoryResource:
        from tensorarena.memory.devices import pinned_pool

        return pinned_pool()

    def __call__(self, size: int) -> Any:
        """``size`` bytes as a ``cupy.cuda.PinnedMemoryPointer``."""
        resource = self.resource
        nbytes = max(int(size), 1)
        address = resource.allocate(nbytes, DEFAULT_ALIGNMENT, None)
        return self._cupy.cuda.PinnedMemoryPointer(_Block(resource, address, nbytes, None), 0)


@contextlib.contextmanager
def use_with_cupy(
    resource: MemoryResource | None = None,
    *,
    pinned: MemoryResource | bool | None = None,
    cupy: Any = None,
) -> Iterator[CupyAllocator]:
    """Route CuPy's device allocations (and, unless ``pinned=False``, its pinned ones) through
    tensorarena inside the block; CuPy's own allocators are put back after."""
    module = _cupy(cupy)
    cuda = module.cuda
    allocator = CupyAllocator(resource, cupy=module)
    previous = cuda.get_allocator()
    cuda.set_allocator(allocator)
    swap_pinned = pinned is not False
    if swap_pinned:
        pinned_resource = pinned if not isinstance(pinned, bool) else None
        cuda.set_pinned_memory_allocator(CupyPinnedAllocator(pinned_resource, cupy=module))
    try:
        yield allocator
    finally:
        cuda.set_allocator(previous)
        if swap_pinned:
            # CuPy has no getter for the pinned allocator: its default is its pinned pool.
            cuda.set_pinned_memory_allocator(module.get_default_pinned_memory_pool().malloc)
