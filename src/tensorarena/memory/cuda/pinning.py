"""Host memory the CUDA driver has pinned: the pinning backends and ``register()``.

``mlock`` keeps pages resident, but the driver does not know it: a copy from them is staged
through the driver's own bounce buffer at pageable speed, a fraction of
what registered memory gets (``bench/RESULTS.md``). Memory is *DMA-registered* only when the
driver pinned it itself, either by allocating it (``cudaHostAlloc``) or by registering existing
pages (``cudaHostRegister``). Both are offered here as
:class:`~tensorarena.memory.PinningBackend` implementations for
:class:`~tensorarena.memory.PinnedHostMemory` (``backend="auto"`` picks
:class:`CudaHostAllocBackend` where CUDA is present):

- :class:`CudaHostAllocBackend` — ``cudaHostAlloc`` (portable: every device may DMA it);
- :class:`CudaRegisterBackend` — our own ``mmap`` (so NUMA binding and huge pages stay ours),
  then ``cudaHostRegister``;

and :func:`register` registers memory that already exists (a NumPy array, a mapped file) for as
long as the returned :class:`HostRegistration` is open.

Driver-pinned memory is not counted against ``RLIMIT_MEMLOCK``, so these backends report no
limit; a dedicated pool over them (``tensorarena.memory.devices.pinned_pool()``) keeps their use
bounded, as the source document asks of scarce pinned memory.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import weakref
from types import TracebackType
from typing import Any

from tensorarena.errors import CudaError, InvalidArgumentError
from tensorarena.memory.cuda.runtime import OUT_OF_MEMORY, CudaRuntime, cuda_runtime
from tensorarena.memory.host import PAGE_SIZE, map_region, unmap_region
from tensorarena.sizes import align_up, check_address, check_nbytes, format_size

__all__ = ["CudaHostAllocBackend", "CudaRegisterBackend", "HostRegistration", "register"]


def _as_os_error(exc: CudaError, what: str) -> OSError:
    """Out of memory as the OSError a PinnedHostMemory turns into OutOfMemoryError."""
    return OSError(errno.ENOMEM, f"{what}: {exc.name}")


class CudaHostAllocBackend:
    """Pin by ``cudaHostAlloc``: page-locked host memory the driver allocated and knows."""

    name = "cuda_host_alloc"
    #: The driver pinned it: copies run by direct DMA.
    dma_registered = True

    def __init__(self, *, runtime: CudaRuntime | None = None, portable: bool = True) -> None:
        self._runtime = cuda_runtime() if runtime is None else runtime
        self._portable = bool(portable)
        self._bases: dict[int, int] = {}  # handed-out address -> address to cudaFreeHost
        self._lock = threading.Lock()

    def pin(self, length: int, alignment: int) -> int:
        """``cudaHostAlloc`` ``length`` bytes (over-allocating to honour a large alignment)."""
        extra = alignment - PAGE_SIZE if alignment > PAGE_SIZE else 0
        try:
            base = self._runtime.host_alloc(length + extra, portable=self._portable)
        except CudaError as exc:
            if exc.status == OUT_OF_MEMORY:
                raise _as_os_error(exc, "cudaHostAlloc") from exc
            raise
        address = align_up(base, alignment)
        with self._lock:
            self._bases[address] = base
        return address

    def unpin(self, address: int, length: int) -> None:
        """``cudaFreeHost`` the region."""
        with self._lock:
            base = self._bases[address]
        self._runtime.free_host(base)
        with self._lock:
            del self._bases[address]

    def limit(self) -> int | None:
        """None: driver-pinned memory is not capped by RLIMIT_MEMLOCK."""
        return None

    def pinned(self) -> int | None:
        """None: the driver does not say how much the process has pinned."""
        return None

    def __repr__(self) -> str:
        return f"CudaHostAllocBackend(portable={self._portable})"


class CudaRegisterBackend:
    """Pin by ``mmap`` + ``cudaHostRegister``: our own pages, registered with the driver."""

    name = "cuda_register"
    #: The driver pinned it: copies run by direct DMA.
    dma_registered = True

    def __init__(self, *, runtime: CudaRuntime | None = None, portable: bool = True) -> None:
        self._runtime = cuda_runtime() if runtime is None else runtime
        self._portable = bool(portable)

    def pin(self, length: int, alignment: int) -> int:
        """Map ``length`` bytes and register them; unmapped again if registering fails."""
        address = map_region(length, alignment)
        try:
            self._runtime.host_register(address, length, portable=self._portable)
        except CudaError as exc:
            unmap_region(address, length)
            if exc.status == OUT_OF_MEMORY:
                raise _as_os_error(exc, "cudaHostRegister") from exc
            raise
        return address

    def unpin(self, address: int, length: int) -> None:
        """Unregister, then unmap."""
        self._runtime.host_unregister(address)
        unmap_region(address, length)

    def limit(self) -> int | None:
        """None: driver-pinned memory is not capped by RLIMIT_MEMLOCK."""
        return None

    def pinned(self) -> int | None:
        """None: the driver does not say how much the process has pinned."""
        return None

    def __repr__(self) -> str:
        return f"CudaRegisterBackend(portable={self._portable})"


def _unregister(runtime: CudaRuntime, address: int) -> None:
    with contextlib.suppress(CudaError):  # nobody to report to from a finalizer
        runtime.host_unregister(address)


class HostRegistration:
    """Existing host memory registered with the driver until :meth:`close` (or the end of a
    ``with`` block, or this object's collection). Keeps the registered object alive while it is
    registered: a registration dropped without ``close()`` unregisters first, while the memory
    is still there, so the range is never left registered to whatever is mapped there next."""

    def __init__(
        self, runtime: CudaRuntime, address: int, nbytes: int, keep: Any = None
    ) -> None:
        self._runtime = runtime
        self._address = address
        self._nbytes = nbytes
        self._keep = keep
        self._open = True
        self._finalizer = weakref.finalize(self, _unregister, runtime, address)

    @property
    def address(self) -> int:
        """The first registered byte."""
        return self._address

    @property
    def nbytes(self) -> int:
        """How many bytes are registered."""
        return self._nbytes

    @property
    def open(self) -> bool:
        """True until :meth:`close`."""
        return self._open

    def close(self) -> None:
        """``cudaHostUnregister`` (once; closing again is harmless)."""
        if self._open:
            self._runtime.host_unregister(self._address)
            self._finalizer.detach()
            self._open = False
            self._keep = None

    def __enter__(self) -> HostRegistration:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._open else "closed"
        return f"HostRegistration({self._address:#x}, {format_size(self._nbytes)}, {state})"


def register(
    memory: Any,
    nbytes: int | None = None,
    *,
    runtime: CudaRuntime | None = None,
    portable: bool = True,
    read_only: bool = False,
) -> HostRegistration:
    """Register existing host memory with the driver (``cudaHostRegister``), so copies from and
    to it run by DMA: an address and ``nbytes``, or an object exposing
    ``__array_interface__`` (a C-contiguous NumPy array), which is kept alive meanwhile.
    ``read_only`` (``cudaHostRegisterReadOnly``): the device only reads the range, which is what
    registering a read-only memory-mapped file needs (a writable registration is refused)."""
    runtime = cuda_runtime() if runtime is None else runtime
    keep = None
    interface = getattr(memory, "__array_interface__", None)
    if interface is not None:
        if interface.get("strides") is not None:
            raise InvalidArgumentError("register() needs a C-contiguous array")
        address = int(interface["data"][0])
        size = int(getattr(memory, "nbytes", 0))
        if nbytes is not None and check_nbytes(nbytes) != size:
            raise InvalidArgumentError(f"nbytes={nbytes} but the array holds {size} bytes")
        keep = memory
    else:
        address = check_address(memory)
        if nbytes is None:
            raise InvalidArgumentError("register(address, nbytes): nbytes is required")
        size = check_nbytes(nbytes)
    if size <= 0:
        raise InvalidArgumentError("register() needs at least one byte")
    runtime.host_register(address, size, portable=portable, read_only=read_only)
    return HostRegistration(runtime, address, size, keep)
