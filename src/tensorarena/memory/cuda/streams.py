"""CUDA streams and events as the objects of :mod:`tensorarena.streams`.

:class:`CudaStream` and :class:`CudaEvent` implement the same small protocols as
:class:`~tensorarena.streams.CpuStream` and its fences (``record()``, ``wait(event)``,
``query()``, ``synchronize()``), so :class:`~tensorarena.adaptors.StreamOrdered` and the
transfer code run unchanged over either: on the CPU in the tests, on a GPU for real.

Frameworks hand out raw stream handles (PyTorch's ``torch.cuda.current_stream().cuda_stream``,
CuPy's ``stream.ptr``, the ``stream`` a pluggable allocator receives). :class:`CudaEvents` is
the :class:`~tensorarena.streams.EventSource` for those: it records events on a handle and makes
a handle wait. Streams compare equal by handle, so the same stream reached through a wrapper and
through a raw handle is one free list in a stream-ordered pool.

An event belongs to a device and can only be recorded on that device's streams, so an event for a
:class:`CudaStream` is made with the stream's device current (a borrowed handle's device is the
current one unless given). Events are created without timing (the cheapest kind) and, like
PyTorch's and RMM's, come from a per-device pool: a collected :class:`CudaEvent` gives its handle
back for the next record instead of destroying it (a ``cudaEventCreate`` per free was the
largest cost of a stream-ordered free). Stream queries use ``cudaStreamQuery``, no event.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any

from tensorarena.errors import CudaError, InvalidArgumentError
from tensorarena.memory.cuda.runtime import CudaRuntime, cuda_runtime, stream_handle
from tensorarena.streams import Event, check_event

__all__ = ["LEGACY_DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM", "CudaEvent", "CudaEvents",
           "CudaStream"]

#: ``cudaStreamLegacy``'s handle, 0: the default stream that synchronises with the others.
LEGACY_DEFAULT_STREAM = 0
#: ``cudaStreamPerThread``'s handle.
PER_THREAD_DEFAULT_STREAM = 2


#: Idle events kept per device and runtime; more are destroyed.
EVENT_POOL_SIZE = 64
_pool_lock = threading.Lock()
_idle: weakref.WeakKeyDictionary[CudaRuntime, dict[int, list[int]]] = (
    weakref.WeakKeyDictionary()
)


def _destroy(runtime: CudaRuntime, destroy: str, handle: int) -> None:
    with contextlib.suppress(CudaError):  # nobody to report to from a finalizer
        getattr(runtime, destroy)(handle)


def _take_event(runtime: CudaRuntime, device: int) -> int:
    with _pool_lock:
        idle = _idle.get(runtime, {}).get(device)
        if idle:
            return idle.pop()
    return runtime.event_create()


def _give_event(runtime: CudaRuntime, device: int, handle: int) -> None:
    with _pool_lock:
        idle = _idle.setdefault(runtime, {}).setdefault(device, [])
        if len(idle) < EVENT_POOL_SIZE:
            idle.append(handle)
            return
    _destroy(runtime, "event_destroy", handle)


def _recorded(runtime: CudaRuntime, device: int, stream: int) -> int:
    """A pooled (or new) event of ``device`` (current) recorded on ``stream``."""
    handle = _take_event(runtime, device)
    try:
        runtime.event_record(handle, stream)
    except BaseException:
        _destroy(runtime, "event_destroy", handle)  # its state is unknown
        raise
    return handle


def idle_events(runtime: CudaRuntime, device: int) -> int:
    """How many pooled events ``device`` has for ``runtime`` (for tests and reports)."""
    with _pool_lock:
        return len(_idle.get(runtime, {}).get(device, ()))


class CudaEvent:
    """A recorded CUDA event: reached once the work queued before it on its stream has run.

    ``device`` is the stream's (default: the current device); the event is made there."""

    def __init__(self, runtime: CudaRuntime, stream: int, device: int | None = None) -> None:
        self._runtime = runtime
        if device is None:  # the current device: no switching
            device = runtime.get_device()
            self._handle = _recorded(runtime, device, stream)
        else:
            with runtime.on_device(device):
                self._handle = _recorded(runtime, device, stream)
        weakref.finalize(self, _give_event, runtime, device, self._handle)
        self._stream = stream
        self._device = device

    @property
    def device(self) -> int:
        """The device the event belongs to."""
        return self._device

    @property
    def handle(self) -> int:
        """The ``cudaEvent_t`` as an int."""
        return self._handle

    def query(self) -> bool:
        """``cudaEventQuery``: True once reached."""
        return self._runtime.event_query(self._handle)

    def synchronize(self) -> None:
        """``cudaEventSynchronize``: block the host until reached."""
        self._runtime.event_synchronize(self._handle)

    def __repr__(self) -> str:
        return f"CudaEvent({self._handle:#x}, stream={self._stream:#x})"


class CudaStream:
    """A CUDA stream: created here (non-blocking, on the current device, destroyed when
    collected) or wrapping an existing ``handle``
    (``CudaStream(handle=torch.cuda.current_stream().cuda_stream, device=0)``; ``device``
    unknown: the current device when an event is recorded)."""

    def __init__(self, *, handle: int | None = None, runtime: CudaRuntime | None = None,
                 device: int | None = None) -> None:
        self._runtime = cuda_runtime() if runtime is None else runtime
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)
                                   or device < 0):
            raise InvalidArgumentError(f"device must be a non-negative int, not {device!r}")
        self._device = device
        if handle is None:
            device = self._runtime.get_device() if device is None else device
            self._device = device
            with self._runtime.on_device(device):
                self._handle = self._runtime.stream_create()
            weakref.finalize(self, _destroy, self._runtime, "stream_destroy", self._handle)
            self._owned = True
        else:
            if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
                raise InvalidArgumentError(f"a stream handle is a non-negative int, not {handle!r}")
            self._handle = handle
            self._owned = False

    @classmethod
    def legacy_default(cls, *, runtime: CudaRuntime | None = None) -> CudaStream:
        """The legacy default stream (handle 0)."""
        return cls(handle=LEGACY_DEFAULT_STREAM, runtime=runtime)

    @property
    def device(self) -> int | None:
        """The stream's device (None: a borrowed handle whose device was not given)."""
        return self._device

    @property
    def handle(self) -> int:
        """The ``cudaStream_t`` as an int."""
        return self._handle

    def __int__(self) -> int:
        return self._handle

    def record(self) -> CudaEvent:
        """An event at the current end of this stream's work."""
        return CudaEvent(self._runtime, self._handle, self._device)

    def wait(self, event: Event) -> None:
        """Later work on this stream waits for ``event``: on the device for a CUDA event,
        on the host (a blocking ``synchronize()``) for any other kind."""
        if isinstance(event, CudaEvent):
            self._runtime.stream_wait_event(self._handle, event.handle)
        else:
            check_event(event).synchronize()

    def query(self) -> bool:
        """True when all work queued so far has run (``cudaStreamQuery``: never blocks)."""
        return self._runtime.stream_query(self._handle)

    def synchronize(self) -> None:
        """``cudaStreamSynchronize``."""
        self._runtime.stream_synchronize(self._handle)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CudaStream):
            return self._handle == other._handle
        if isinstance(other, int) and not isinstance(other, bool):
            return self._handle == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._handle)

    def __repr__(self) -> str:
        owned = "" if self._owned else ", borrowed"
        return f"CudaStream({self._handle:#x}{owned})"


class CudaEvents:
    """The :class:`~tensorarena.streams.EventSource` for raw stream handles (ints, ``None`` for
    the legacy default) and :class:`CudaStream` objects alike."""

    def __init__(self, runtime: CudaRuntime | None = None) -> None:
        self._runtime = cuda_runtime() if runtime is None else runtime

    def record(self, stream: Any) -> CudaEvent:
        """A CUDA event recorded on ``stream``."""
        return CudaEvent(self._runtime, stream_handle(stream))

    def wait(self, stream: Any, event: Event) -> None:
        """Make ``stream`` wait for ``event`` (on the device when it is a CUDA event)."""
        if isinstance(event, CudaEvent):
            self._runtime.stream_wait_event(stream_handle(stream), event.handle)
        else:
            stream_handle(stream)  # a bad handle is refused whatever the event
            check_event(event).synchronize()

    def __repr__(self) -> str:
        return f"CudaEvents({self._runtime!r})"
