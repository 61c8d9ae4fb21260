"""Host↔device copies staged through pinned buffers, pipelined so copies overlap host work.

A copy from pageable memory is slow twice over: the driver stages it through its own bounce
buffer at pageable speed, and the host thread is blocked for the whole copy. ``to_device``
stages the bytes itself, in chunks, through buffers from the dedicated pinned pool: the host
copies chunk *i* into a staging buffer (``memmove``) while the DMA engine copies chunk *i - 1*
from the other buffer to the device, and the call returns as soon as the last chunk is queued;
the copies run on ``stream`` and overlap whatever the host does next. ``to_host`` runs the same
pipeline the other way and returns once the host array is complete.

A staging buffer is written again only once the event of the copy that read it has completed,
and goes back to its pool only then: the same rule :class:`~tensorarena.adaptors.StreamOrdered`
applies to every freed block. The copy engine is pluggable (:class:`CopyEngine`):
:class:`CudaCopies` queues ``cudaMemcpyAsync`` on CUDA streams; :class:`StreamCopies` queues
``memmove`` on :class:`~tensorarena.streams.CpuStream` objects, which is how the pipeline and
its event logic are tested, with real bytes, on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tensorarena.errors import InvalidArgumentError
from tensorarena.interop.device_arrays import DeviceArray, check_device_accessible, device_empty
from tensorarena.memory.resource import MemoryResource, Stream, check_resource
from tensorarena.sizes import Size, format_size, parse_size
from tensorarena.streams import Event

__all__ = [
    "CopyEngine",
    "CudaCopies",
    "StreamCopies",
    "TransferStatistics",
    "Transfers",
    "default_transfers",
    "to_device",
    "to_host",
]

_STAGING_ALIGNMENT = 4096


class CopyEngine(Protocol):
    """Queues copies on a stream and marks points in it."""

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """Queue a copy of ``nbytes`` from ``src`` to ``dst`` on ``stream``."""
        ...

    def record(self, stream: Stream) -> Event:
        """An event after everything queued on ``stream`` so far."""
        ...


class CudaCopies:
    """``cudaMemcpyAsync`` on CUDA streams (``None``: the legacy default stream)."""

    def __init__(self, runtime: Any = None) -> None:
        from tensorarena.memory.cuda import CudaEvents, cuda_runtime

        self._runtime = cuda_runtime() if runtime is None else runtime
        self._events = CudaEvents(self._runtime)

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """``cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream)``."""
        from tensorarena.memory.cuda import stream_handle

        self._runtime.memcpy_async(dst, src, nbytes, stream_handle(stream))

    def record(self, stream: Stream) -> Event:
        """A CUDA event on ``stream``."""
        return self._events.record(stream)


class StreamCopies:
    """``memmove`` queued on stream objects with ``submit``/``record`` (a
    :class:`~tensorarena.streams.CpuStream`); ``None`` means ``default``."""

    def __init__(self, default: Any) -> None:
        self._default = default

    def _stream(self, stream: Stream) -> Any:
        chosen = self._default if stream is None else stream
        if not callable(getattr(chosen, "submit", None)):
            raise InvalidArgumentError(
                f"StreamCopies queues on stream objects with submit() (a CpuStream), not "
                f"{chosen!r}"
            )
        return chosen

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """Queue ``ctypes.memmove(dst, src, nbytes)`` on the stream."""
        self._stream(stream).submit(ctypes.memmove, dst, src, nbytes)

    def record(self, stream: Stream) -> Event:
        """The stream's fence."""
        return self._stream(stream).record()  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class TransferStatistics:
    """What a :class:`Transfers` has moved, and how often the host waited for the DMA."""

    bytes_to_device: int
    bytes_to_host: int
    chunks: int
    host_waits: int  #: a staging buffer was still being copied when the host needed it
    staging_in_flight: int  #: staging buffers waiting for their copy's event


class Transfers:
    """Copies between host arrays and :class:`~tensorarena.interop.DeviceArray` objects.

    ``device``: where ``to_device`` puts arrays (a device or managed resource); ``staging``:
    the pinned pool staging buffers come from; ``engine``: how copies are queued. ``chunk``
    bytes are staged at a time, through ``depth`` buffers (2: one filled by the host while the
    other is copied).
    """

    def __init__(
        self,
        device: MemoryResource,
        staging: MemoryResource,
        engine: CopyEngine,
        *,
        chunk: Size = "8MiB",
        depth: int = 2,
    ) -> None:
        self._device = check_device_accessible(check_resource(device, name="device"))
        self._staging = check_resource(staging, name="staging")
        if not (callable(getattr(engine, "copy_async", None))
                and callable(getattr(engine, "record", None))):
            raise InvalidArgumentError(
                f"engine must be a CopyEngine (copy_async, record), not {type(engine).__name__}"
            )
        self._engine = engine
        self._chunk = parse_size(chunk, name="chunk")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentError(f"depth must be a positive int, not {depth!r}")
        self._depth = depth
        self._lock = threading.Lock()
        self._in_flight: deque[tuple[Event, int, int]] = deque()  # (event, buffer, nbytes)
        self._to_device = self._to_host = self._chunks = self._host_waits = 0

    # --- the two directions ----------------------------------------------------------------

    def to_device(self, array: Any, *, stream: Stream = None) -> DeviceArray:
        """A new device array holding a copy of ``array``; the copy is queued on ``stream`` and
        may still be running when this returns (the array's interface names the stream)."""
        source = np.ascontiguousarray(array)
        if source.dtype.hasobject:
            raise InvalidArgumentError("arrays of Python objects cannot be copied to a device")
        target = device_empty(source.shape, source.dtype, resource=self._device, stream=stream)
        if source.nbytes:
            self._pipeline(source.ctypes.data, target.address, source.nbytes, stream, upload=True)
        target.written_on(stream)
        with self._lock:
            self._to_device += source.nbytes
        return target

    def to_host(
        self, source: DeviceArray, *, stream: Stream = None, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """The bytes of ``source`` in a host array (``out`` if given: C-contiguous, same shape
        and dtype), copied on ``stream`` (default: the stream that last wrote ``source``);
        returns once every byte has arrived."""
        if not isinstance(source, DeviceArray):
            raise InvalidArgumentError(
                f"to_host() copies a DeviceArray, not {type(source).__name__}"
            )
        if out is None:
            out = np.empty(source.shape, source.dtype)
        elif (
            not isinstance(out, np.ndarray)
            or out.shape != source.shape
            or out.dtype != source.dtype
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise InvalidArgumentError(
                f"out must be a writeable C-contiguous array of shape {source.shape} and dtype "
                f"{source.dtype}"
            )
        stream = source.stream if stream is None else stream
        if out.nbytes:
            self._pipeline(source.address, out.ctypes.data, out.nbytes, stream, upload=False)
        with self._lock:
            self._to_host += out.nbytes
        return out

    def synchronize(self) -> None:
        """Wait for every staged copy still in flight and give its buffer back."""
        with self._lock:
            in_flight, self._in_flight = self._in_flight, deque()
        for event, buffer, nbytes in in_flight:
            event.synchronize()
            self._staging.deallocate(buffer, nbytes)

    def statistics(self) -> TransferStatistics:
        """A frozen snapshot of what was moved."""
        with self._lock:
            return TransferStatistics(
                self._to_device, self._to_host, self._chunks, self._host_waits,
                len(self._in_flight),
            )

    def __repr__(self) -> str:
        return (
            f"Transfers(chunk={format_size(self._chunk)}, depth={self._depth}, "
            f"in_flight={len(self._in_flight)})"
        )

    # --- the pipeline ----------------------------------------------------------------------

    def _pipeline(self, src: int, dst: int, nbytes: int, stream: Stream, *, upload: bool) -> None:
        self._reap()
        chunk = min(self._chunk, nbytes)
        count = min(self._depth, -(-nbytes // chunk))
        buffers: list[int] = []
        events: list[Event | None] = [None] * count
        pending: deque[tuple[int, int, int]] = deque()  # download: (slot, offset, size)
        try:
            for _ in range(count):
                buffers.append(self._staging.allocate(chunk, _STAGING_ALIGNMENT))
            for index, offset in enumerate(range(0, nbytes, chunk)):
                slot, size = index % count, min(chunk, nbytes - offset)
                if upload:
                    self._wait(events[slot])
                    ctypes.memmove(buffers[slot], src + offset, size)
                    self._engine.copy_async(dst + offset, buffers[slot], size, stream)
                else:
                    if len(pending) == count:
                        self._drain_one(pending, events, buffers, dst)
                    self._engine.copy_async(buffers[slot], src + offset, size, stream)
                    pending.append((slot, offset, size))
                events[slot] = self._engine.record(stream)
            while pending:
                self._drain_one(pending, events, buffers, dst)
        except BaseException:
            for event in events:  # never free a buffer a queued copy still reads
                if event is not None:
                    event.synchronize()
            for buffer in buffers:
                self._staging.deallocate(buffer, chunk)
            raise
        with self._lock:
            self._chunks += -(-nbytes // chunk)
            for slot, buffer in enumerate(buffers):
                event = events[slot]
                if upload and event is not None and not event.query():
                    self._in_flight.append((event, buffer, chunk))
                else:
                    self._staging.deallocate(buffer, chunk)

    def _drain_one(
        self,
        pending: deque[tuple[int, int, int]],
        events: list[Event | None],
        buffers: list[int],
        dst: int,
    ) -> None:
        slot, offset, size = pending.popleft()
        self._wait(events[slot])
        ctypes.memmove(dst + offset, buffers[slot], size)

    def _wait(self, event: Event | None) -> None:
        if event is not None and not event.query():
            with self._lock:
                self._host_waits += 1
            event.synchronize()

    def _reap(self) -> None:
        """Give back the staging buffers whose copies have completed."""
        with self._lock:
            while self._in_flight and self._in_flight[0][0].query():
                _, buffer, nbytes = self._in_flight.popleft()
                self._staging.deallocate(buffer, nbytes)


# --- the process's transfers over CUDA --------------------------------------------------------

_lock = threading.Lock()
_default: Transfers | None = None


def default_transfers() -> Transfers:
    """Transfers between the host and the current device's pool, staged through the process's
    pinned pool, queued with ``cudaMemcpyAsync`` (made on first use)."""
    global _default
    with _lock:
        if _default is None:
            from tensorarena.memory.devices import device_registry, pinned_pool

            _default = Transfers(device_registry().resource(), pinned_pool(), CudaCopies())
        return _default


def to_device(array: Any, *, stream: Stream = None) -> DeviceArray:
    """Copy a host array to the current GPU through pinned staging buffers, asynchronously on
    ``stream`` (see :meth:`Transfers.to_device`)."""
    return default_transfers().to_device(array, stream=stream)


def to_host(
    source: DeviceArray, *, stream: Stream = None, out: np.ndarray[Any, Any] | None = None
) -> np.ndarray[Any, Any]:
    """Copy a device array back to a host array (see :meth:`Transfers.to_host`)."""
    return default_transfers().to_host(source, stream=stream, out=out)
