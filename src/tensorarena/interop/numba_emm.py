"""Numba's device allocations routed through tensorarena: an External Memory Management plugin.

Numba's EMM interface (NBEP 7) lets one class take over every device allocation of
``numba.cuda``: ``memalloc(size)`` returns a ``MemoryPointer`` with a *finalizer* that Numba
calls when the last array over it dies. :func:`memory_manager_class` builds that class on
``numba.cuda.HostOnlyCUDAMemoryManager`` (Numba keeps managing host and mapped memory; we take
device memory), with each block from a tensorarena resource (default: the context's device's
stream-ordered pool, :func:`~tensorarena.interop.stream_pools.stream_ordered_pool`) and the
finalizer giving it back, with the block's device current. EMM passes no stream: blocks are
allocated and freed on the legacy default stream, where Numba runs unless told otherwise; the
legacy stream also orders after Numba's own (blocking) streams, so a block freed while a kernel
on one of them still uses it waits for that kernel. Install it with ``use_with_numba()`` before
Numba makes its first context, or for a whole run with the environment variable::

    NUMBA_CUDA_MEMORY_MANAGER=tensorarena.interop.numba_emm

which makes Numba read this module's ``_numba_memory_manager`` (made on first access).

``defer_cleanup`` is the host-only manager's: a pool keeps its arenas, so there is no expensive
cleanup to defer. IPC handles are not supported (a pool's
blocks are not separate driver allocations).
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from typing import Any

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError, TensorArenaError
from tensorarena.memory.cuda.current import block_device
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    check_resource,
    resource_stack,
)

__all__ = ["memory_manager_class", "use_with_numba"]

ResourceFactory = Callable[[int], MemoryResource]


def _default_factory(device: int) -> MemoryResource:
    from tensorarena.interop.stream_pools import stream_ordered_pool

    return stream_ordered_pool(device)


def _device_pointer(numba_cuda: Any, address: int) -> Any:
    """The pointer type Numba's MemoryPointer takes: the NVIDIA binding's ``CUdeviceptr`` when
    Numba runs on it (every recent numba-cuda), else a ctypes integer."""
    driver = getattr(getattr(numba_cuda, "cudadrv", None), "driver", None)
    if getattr(driver, "USE_NV_BINDING", True):
        try:
            return importlib.import_module("cuda.bindings.driver").CUdeviceptr(address)
        except ImportError:
            pass
    return ctypes.c_uint64(address)


def _finalizer(resource: MemoryResource, address: int, nbytes: int, device: int
               ) -> Callable[[], None]:
    def free() -> None:
        with block_device(device):
            resource.deallocate(address, nbytes)

    return free


def memory_manager_class(
    factory: ResourceFactory | None = None, *, numba_cuda: Any = None
) -> type:
    """An EMM plugin class whose device blocks come from ``factory(device)`` (default: the
    device's stream-ordered pool). ``numba_cuda`` defaults to ``numba.cuda``."""
    cuda = numba_cuda if numba_cuda is not None else require(
        "numba.cuda", extra="numba", feature="the Numba memory manager plugin"
    )
    if factory is not None and not callable(factory):
        raise InvalidArgumentError(
            f"factory must be a callable device -> resource, not {type(factory).__name__}"
        )
    make = factory or _default_factory

    class TensorArenaMemoryManager(cuda.HostOnlyCUDAMemoryManager):  # type: ignore[misc,name-defined]
        """Numba's device memory from a tensorarena resource."""

        _resource: MemoryResource | None = None

        def initialize(self) -> None:
            """Bind this context's device to its resource (safe to call again)."""
            if self._resource is None:
                self._resource = check_resource(make(self._device_id()), name="factory(device)")

        def memalloc(self, size: int) -> Any:
            """``size`` bytes of device memory as a Numba ``MemoryPointer``."""
            self.initialize()
            resource = self._resource
            assert resource is not None
            nbytes = max(int(size), 1)
            address = resource.allocate(nbytes, DEFAULT_ALIGNMENT)
            return cuda.MemoryPointer(
                self.context,
                _device_pointer(cuda, address),
                nbytes,
                finalizer=_finalizer(resource, address, nbytes, self._device_id()),
            )

        def get_memory_info(self) -> Any:
            """The device's free and total bytes (from the resource's ``mem_info()`` where it
            has one, e.g. a pool over CudaMemory; else the runtime's)."""
            self.initialize()
            upstream = next((layer for layer in resource_stack(self._resource)
                             if hasattr(layer, "mem_info")), None)
            if upstream is None:
                from tensorarena.memory.cuda import cuda_runtime

                free, total = cuda_runtime().mem_get_info()
            else:
                free, total = upstream.mem_info()
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory: Any) -> Any:
            """Not supported: a pool's blocks are not separate driver allocations."""
            raise TensorArenaError(
                "IPC handles are not supported by the tensorarena memory manager"
            )

        @property
        def interface_version(self) -> int:
            """The EMM interface version this plugin implements."""
            return 1

        def _device_id(self) -> int:
            device = getattr(getattr(self, "context", None), "device", None)
            return int(getattr(device, "id", 0))

    return TensorArenaMemoryManager


def use_with_numba(factory: ResourceFactory | None = None, *, numba_cuda: Any = None) -> type:
    """Make Numba allocate device memory through tensorarena (call before Numba's first CUDA
    context exists); return the plugin class installed."""
    cuda = numba_cuda if numba_cuda is not None else require(
        "numba.cuda", extra="numba", feature="the Numba memory manager plugin"
    )
    manager = memory_manager_class(factory, numba_cuda=cuda)
    cuda.set_memory_manager(manager)
    return manager


def __getattr__(name: str) -> Any:
    # NUMBA_CUDA_MEMORY_MANAGER=tensorarena.interop.numba_emm makes Numba read this attribute.
    if name == "_numba_memory_manager":
        manager = memory_manager_class()
        globals()[name] = manager
        return manager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
