"""The CUDA runtime calls tensorarena makes, each status checked and turned into our errors.

NVIDIA's ``cuda-python`` bindings (``cuda.bindings.runtime``; ``cuda.cudart`` in older releases)
mirror the C API: every function returns a tuple whose first item is the ``cudaError_t`` status
and whose other items are the outputs (``err, ptr = cudaMalloc(n)``). Forgetting to look at the
status is the classic CUDA bug, so no other module calls the bindings: :class:`CudaRuntime` wraps
the handful of calls we need, checks every status, raises
:class:`~tensorarena.errors.CudaError` (with the call, the code and its name) for a failure, and
returns plain Python ints (addresses, stream and event handles).

The wrapper takes the bindings module as an argument, so tests run every status-checking and
bookkeeping path on the CPU against a fake module with the same conventions, and the resources
above it never import CUDA themselves. The bindings are imported lazily
(:func:`cuda_runtime`), with the ``cuda`` extra named when they are missing.

Switching devices (:meth:`CudaRuntime.on_device`) restores the previous device only where that
device's primary context exists (``cuDevicePrimaryCtxGetState``, as PyTorch's ``MaybeSetDevice``
does): since CUDA 12 ``cudaSetDevice`` creates the context, and a thread that only ever used
device 1 must not pay for (or be seen holding) one on device 0. Handles are read with
cuda-bindings 13's ``getPtr()`` where it exists (``int()`` of a handle is deprecated there).

Signatures that moved between CUDA 12 and 13 (``cudaMemAdvise``, ``cudaMemPrefetchAsync`` take
a ``cudaMemLocation`` from 12.2 as ``*_v2`` and from 13 under the plain name) are tried newest
first, once, and the form that works is kept.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tensorarena._optional import require
from tensorarena.errors import CudaError, InvalidArgumentError, MissingDependencyError
from tensorarena.memory.cuda.handles import handle_value, stream_handle

__all__ = [
    "CPU_DEVICE",
    "NOT_READY",
    "OUT_OF_MEMORY",
    "CudaRuntime",
    "cuda_available",
    "cuda_runtime",
    "handle_value",
    "set_cuda_runtime",
    "stream_handle",
]

#: ``cudaErrorMemoryAllocation``: the resources turn it into OutOfMemoryError.
OUT_OF_MEMORY = 2
#: ``cudaErrorNoDevice``: no GPU visible.
NO_DEVICE = 100
#: ``cudaErrorNotReady``: what ``cudaEventQuery`` says of an event not yet reached.
NOT_READY = 600
#: ``CUDA_ERROR_NOT_INITIALIZED``: the driver answers this before any context exists.
_DRIVER_NOT_INITIALIZED = 3
#: ``cudaCpuDeviceId``: the host as a prefetch or advice target.
CPU_DEVICE = -1

_HOST_ALLOC_PORTABLE = 1
_HOST_REGISTER_PORTABLE = 1
_HOST_REGISTER_READ_ONLY = 8
_MEM_ATTACH_GLOBAL = 1
_EVENT_DISABLE_TIMING = 2
_STREAM_NON_BLOCKING = 1
_MEMCPY_DEFAULT = 4
_LOCATION_DEVICE, _LOCATION_HOST = 1, 2


class CudaRuntime:
    """Checked calls into a CUDA runtime bindings module (``cuda.bindings.runtime``); ``driver``
    (``cuda.bindings.driver``) answers whether a device's context exists (default: the runtime
    module itself, where it has ``cuDevicePrimaryCtxGetState``)."""

    def __init__(self, cudart: Any, driver: Any = None) -> None:
        self._cudart = cudart
        self._driver = cudart if driver is None else driver
        self._location_api: bool | None = None  # None: not tried yet
        self._available: bool | None = None

    @property
    def bindings(self) -> Any:
        """The bindings module in use."""
        return self._cudart

    # --- the one place statuses are read -----------------------------------------------------

    def call(self, function: str, *args: Any) -> Any:
        """Call ``function`` of the bindings; raise CudaError unless it returned success.

        Returns ``None``, the single output, or a tuple of outputs.
        """
        result = getattr(self._cudart, function)(*args)
        status, outputs = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
        code = int(status)
        if code != 0:
            if code != NOT_READY:
                # A failed call also sets the thread's "last error", which the next library to
                # check it (PyTorch, after every kernel launch) would report as its own
                # failure: clear it, as PyTorch does after a failed cudaMalloc.
                with contextlib.suppress(Exception):
                    self._cudart.cudaGetLastError()
            raise CudaError(function, code, self._error_name(status, code))
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else outputs

    def _error_name(self, status: Any, code: int) -> str:
        name = getattr(status, "name", None)
        if isinstance(name, str):
            return name
        with contextlib.suppress(Exception):
            result = self._cudart.cudaGetErrorName(status)
            text = result[1] if isinstance(result, tuple) else result
            return text.decode() if isinstance(text, bytes) else str(text)
        return f"cudaError {code}"

    def _enum(self, enum: str, member: str, value: int) -> Any:
        """The bindings' enum member, or the plain int where the module has no such enum."""
        return getattr(getattr(self._cudart, enum, None), member, value)

    # --- devices -----------------------------------------------------------------------------

    def device_count(self) -> int:
        """``cudaGetDeviceCount`` (0 where it says ``cudaErrorNoDevice``)."""
        try:
            return int(self.call("cudaGetDeviceCount"))
        except CudaError as exc:
            if exc.status == NO_DEVICE:
                return 0
            raise

    def available(self) -> bool:
        """True when the runtime answers and sees at least one device (cached)."""
        if self._available is None:
            try:
                self._available = self.device_count() > 0
            except CudaError:  # no driver, no device, insufficient driver
                self._available = False
        return self._available

    def get_device(self) -> int:
        """``cudaGetDevice``: the calling thread's current device."""
        return int(self.call("cudaGetDevice"))

    def set_device(self, device: int) -> None:
        """``cudaSetDevice``."""
        self.call("cudaSetDevice", device)

    def has_context(self, device: int) -> bool:
        """True when ``device``'s primary context exists (or the driver cannot say); False
        too while the driver is not initialised (``CUDA_ERROR_NOT_INITIALIZED``: no context)."""
        query = getattr(self._driver, "cuDevicePrimaryCtxGetState", None)
        if query is None:
            return True
        try:
            result = query(getattr(self._driver, "CUdevice", int)(device))
            status = int(result[0])
            if status == _DRIVER_NOT_INITIALIZED:
                return False
            return status != 0 or bool(result[2])
        except Exception:
            return True

    @contextlib.contextmanager
    def on_device(self, device: int) -> Iterator[None]:
        """Make ``device`` current for the block, and the previous one current again after
        (unless it has no context yet: restoring would create one)."""
        previous = self.get_device()
        if previous == device:
            yield
            return
        self.set_device(device)
        try:
            yield
        finally:
            if self.has_context(previous):
                self.set_device(previous)

    def mem_get_info(self) -> tuple[int, int]:
        """``cudaMemGetInfo``: ``(free, total)`` bytes of the current device."""
        free, total = self.call("cudaMemGetInfo")
        return int(free), int(total)

    def device_synchronize(self) -> None:
        """``cudaDeviceSynchronize``."""
        self.call("cudaDeviceSynchronize")

    # --- memory ------------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> int:
        """``cudaMalloc`` on the current device."""
        return int(self.call("cudaMalloc", nbytes))

    def free(self, address: int) -> None:
        """``cudaFree``."""
        self.call("cudaFree", address)

    def host_alloc(self, nbytes: int, *, portable: bool = True) -> int:
        """``cudaHostAlloc``: page-locked host memory the driver knows (direct DMA)."""
        return int(self.call("cudaHostAlloc", nbytes, _HOST_ALLOC_PORTABLE if portable else 0))

    def free_host(self, address: int) -> None:
        """``cudaFreeHost``."""
        self.call("cudaFreeHost", address)

    def host_register(self, address: int, nbytes: int, *, portable: bool = True,
                      read_only: bool = False) -> None:
        """``cudaHostRegister``: page-lock existing host memory and register it for DMA
        (``read_only``: the device only reads it, as a read-only mapped file needs)."""
        flags = (_HOST_REGISTER_PORTABLE if portable else 0) | (
            _HOST_REGISTER_READ_ONLY if read_only else 0)
        self.call("cudaHostRegister", address, nbytes, flags)

    def host_unregister(self, address: int) -> None:
        """``cudaHostUnregister``."""
        self.call("cudaHostUnregister", address)

    def malloc_managed(self, nbytes: int) -> int:
        """``cudaMallocManaged`` (attached globally: any stream, any device may touch it)."""
        return int(self.call("cudaMallocManaged", nbytes, _MEM_ATTACH_GLOBAL))

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """``cudaMemcpy`` (direction inferred from the addresses: unified addressing)."""
        kind = self._enum("cudaMemcpyKind", "cudaMemcpyDefault", _MEMCPY_DEFAULT)
        self.call("cudaMemcpy", dst, src, nbytes, kind)

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``cudaMemcpyAsync`` on ``stream`` (a handle)."""
        kind = self._enum("cudaMemcpyKind", "cudaMemcpyDefault", _MEMCPY_DEFAULT)
        self.call("cudaMemcpyAsync", dst, src, nbytes, kind, stream)

    def memset(self, address: int, value: int, nbytes: int) -> None:
        """``cudaMemset``."""
        self.call("cudaMemset", address, value, nbytes)

    # --- managed-memory hints: the call changed shape between CUDA 12 and 13 -------------------

    def _location(self, device: int) -> Any:
        location = self._cudart.cudaMemLocation()
        kind = "cudaMemLocationTypeHost" if device == CPU_DEVICE else "cudaMemLocationTypeDevice"
        location.type = self._enum(
            "cudaMemLocationType", kind, _LOCATION_HOST if device == CPU_DEVICE else
            _LOCATION_DEVICE,
        )
        location.id = 0 if device == CPU_DEVICE else device
        return location

    def _hint(
        self, function: str, legacy: tuple[Any, ...], modern: Callable[[], tuple[Any, ...]]
    ) -> None:
        """Call ``function`` in the location form (``*_v2`` on 12.2+, the plain name on 13)
        or, where the bindings predate it, the device-number form."""
        if self._location_api is not False and hasattr(self._cudart, "cudaMemLocation"):
            v2 = f"{function}_v2"
            name = v2 if hasattr(self._cudart, v2) else function
            try:
                self.call(name, *modern())
                self._location_api = True
                return
            except TypeError:
                if self._location_api:
                    raise
                self._location_api = False
        self.call(function, *legacy)

    def mem_advise(self, address: int, nbytes: int, advice: int, device: int) -> None:
        """``cudaMemAdvise`` (``advice`` the cudaMemoryAdvise number; ``device`` or CPU_DEVICE)."""
        value = self._advice(advice)
        self._hint(
            "cudaMemAdvise",
            (address, nbytes, value, device),
            lambda: (address, nbytes, value, self._location(device)),
        )

    def mem_prefetch(self, address: int, nbytes: int, device: int, stream: int) -> None:
        """``cudaMemPrefetchAsync`` of a managed range to ``device`` (or CPU_DEVICE)."""
        self._hint(
            "cudaMemPrefetchAsync",
            (address, nbytes, device, stream),
            lambda: (address, nbytes, self._location(device), 0, stream),
        )

    def _advice(self, advice: int) -> Any:
        enum = getattr(self._cudart, "cudaMemoryAdvise", None)
        if enum is None:
            return advice
        try:
            return enum(advice)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"no cudaMemoryAdvise numbered {advice}") from None

    # --- streams and events ------------------------------------------------------------------

    def stream_create(self) -> int:
        """``cudaStreamCreateWithFlags(cudaStreamNonBlocking)``: a stream that does not
        synchronise with the legacy default stream."""
        return handle_value(self.call("cudaStreamCreateWithFlags", _STREAM_NON_BLOCKING))

    def stream_destroy(self, stream: int) -> None:
        """``cudaStreamDestroy``."""
        self.call("cudaStreamDestroy", stream)

    def stream_synchronize(self, stream: int) -> None:
        """``cudaStreamSynchronize``."""
        self.call("cudaStreamSynchronize", stream)

    def _ready(self, function: str, handle: int) -> bool:
        try:
            self.call(function, handle)
        except CudaError as exc:
            if exc.status == NOT_READY:
                return False
            raise
        return True

    def stream_query(self, stream: int) -> bool:
        """``cudaStreamQuery``: True when the stream is idle, False while work is pending."""
        return self._ready("cudaStreamQuery", stream)

    def stream_wait_event(self, stream: int, event: int) -> None:
        """``cudaStreamWaitEvent``: later work on ``stream`` waits for ``event``."""
        self.call("cudaStreamWaitEvent", stream, event, 0)

    def event_create(self) -> int:
        """``cudaEventCreateWithFlags(cudaEventDisableTiming)``: the cheapest kind of event."""
        return handle_value(self.call("cudaEventCreateWithFlags", _EVENT_DISABLE_TIMING))

    def event_record(self, event: int, stream: int) -> None:
        """``cudaEventRecord``."""
        self.call("cudaEventRecord", event, stream)

    def event_query(self, event: int) -> bool:
        """``cudaEventQuery``: True once reached, False while not ready; errors raise."""
        return self._ready("cudaEventQuery", event)

    def event_synchronize(self, event: int) -> None:
        """``cudaEventSynchronize``."""
        self.call("cudaEventSynchronize", event)

    def event_destroy(self, event: int) -> None:
        """``cudaEventDestroy``."""
        self.call("cudaEventDestroy", event)

    def __repr__(self) -> str:
        return f"CudaRuntime({getattr(self._cudart, '__name__', type(self._cudart).__name__)})"


# --- the process's runtime ---------------------------------------------------------------------

_lock = threading.Lock()
_runtime: CudaRuntime | None = None
_missing = False  # the bindings failed to import once: cuda_available() does not retry


def _import_bindings() -> Any:
    try:
        return importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        pass
    return require("cuda.cudart", extra="cuda", feature="CUDA memory (tensorarena.memory.cuda)")


def cuda_runtime() -> CudaRuntime:
    """The process's :class:`CudaRuntime` over NVIDIA's bindings (imported on first call).

    Raises :class:`~tensorarena.errors.MissingDependencyError` naming the ``cuda`` extra when
    the bindings are not installed.
    """
    global _runtime
    with _lock:
        if _runtime is None:
            bindings = _import_bindings()
            try:
                driver = importlib.import_module("cuda.bindings.driver")
            except ImportError:
                driver = None
            _runtime = CudaRuntime(bindings, driver)
        return _runtime


def set_cuda_runtime(runtime: CudaRuntime | None) -> CudaRuntime | None:
    """Use ``runtime`` as the process's runtime (``None``: import the bindings again when next
    asked); return the previous one. For tests, and for programs that bring their own."""
    global _runtime, _missing
    if runtime is not None and not isinstance(runtime, CudaRuntime):
        raise InvalidArgumentError(f"expected a CudaRuntime, not {type(runtime).__name__}")
    with _lock:
        previous, _runtime = _runtime, runtime
        _missing = False
    return previous


def cuda_available() -> bool:
    """True when the CUDA bindings import and the runtime sees a device; never raises.

    A failed import is remembered, so asking again (every ``PinnedHostMemory()`` does) is free.
    """
    global _missing
    if _missing:
        return False
    try:
        return cuda_runtime().available()
    except MissingDependencyError:
        _missing = True
        return False
