"""The simulator's stream and event calls (``cudaStream*``, ``cudaEvent*``).

Handles 0 and 1 are the legacy default stream of the calling thread's current device, 2 its
per-thread default stream (both synchronise with the legacy one, as ``cudaStreamPerThread``
does); created streams are non-blocking when asked for ``cudaStreamNonBlocking``. An event
belongs to the device current when it was made: recording it on another device's stream fails
with ``cudaErrorInvalidResourceHandle``, as CUDA does, while waiting on it from any device works.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from tensorarena.memory.cuda.handles import stream_handle
from tensorarena.testing.cuda._errors import Failure, cudaError_t
from tensorarena.testing.cuda._streams import Op, Scheduler, SimEvent, SimStream

__all__ = ["StreamCalls"]

_NON_BLOCKING = 1
_PER_THREAD = 2


class StreamCalls:
    """Mixed into :class:`~tensorarena.testing.cuda.Simulator`: the stream and event calls."""

    scheduler: Scheduler
    _local: threading.local
    _handles: itertools.count[int]

    if TYPE_CHECKING:  # provided by the Simulator they are mixed into

        def _call(self, name: str, body: Any, *args: Any, context: bool = True) -> tuple[Any, ...]:
            raise NotImplementedError

        def _current(self) -> int:
            raise NotImplementedError

        def _check_sticky(self, device: int) -> None:
            raise NotImplementedError

    def _init_streams(self, devices: int) -> None:
        self._legacy = [SimStream(0, d, blocking=True, legacy=True) for d in range(devices)]
        self._per_thread: dict[tuple[int, int], SimStream] = {}
        self._streams: dict[int, SimStream] = {}
        self._events: dict[int, SimEvent] = {}
        self.scheduler.streams.extend(self._legacy)

    # --- lookup --------------------------------------------------------------------------------

    def stream(self, handle: Any) -> SimStream:
        """The stream a handle (or a stream object: ours, PyTorch's, CuPy's) names for the
        calling thread (0/1 legacy, 2 per-thread)."""
        handle = stream_handle(handle)
        device = self._current()
        if handle in (0, 1):
            return self._legacy[device]
        if handle == _PER_THREAD:
            key = (threading.get_ident(), device)
            stream = self._per_thread.get(key)
            if stream is None:
                stream = self._per_thread[key] = SimStream(_PER_THREAD, device, blocking=True)
                self.scheduler.streams.append(stream)
            return stream
        stream = self._streams.get(handle)
        if stream is None:
            raise Failure(cudaError_t.cudaErrorInvalidResourceHandle)
        self._check_sticky(stream.device)
        return stream

    def _event(self, handle: Any) -> SimEvent:
        event = self._events.get(int(handle))
        if event is None:
            raise Failure(cudaError_t.cudaErrorInvalidResourceHandle)
        return event

    def enqueue(self, stream: SimStream, op: Op, inherited: dict[SimStream, int] | None = None
                ) -> Op:
        """Queue ``op`` on ``stream`` (blocking streams after the device's legacy stream)."""
        return self.scheduler.enqueue(stream, op, self._legacy[stream.device], inherited)

    def sync_stream(self, stream: SimStream, upto: Op | None = None) -> None:
        """Block the host until ``stream`` ran every queued op (or up to the op ``upto``)."""
        target = stream.queued if upto is None else upto.seq
        if not self.scheduler.run_until(lambda: stream.done >= target):
            raise Failure(cudaError_t.cudaErrorNotReady)  # held: would hang on a GPU
        self.scheduler.seen(stream, target, None if upto is None else upto.clock)
        self._check_sticky(stream.device)

    def sync_device(self, device: int) -> None:
        """Block the host until every stream of ``device`` is idle."""
        for stream in list(self.scheduler.streams):
            if stream.device == device:
                self.sync_stream(stream)

    # --- streams -------------------------------------------------------------------------------

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[Any, ...]:
        """A stream of the current device."""
        return self._call("cudaStreamCreateWithFlags", self._stream_create, flags)

    def _stream_create(self, flags: int) -> tuple[int]:
        handle = next(self._handles)
        stream = SimStream(handle, self._current(), blocking=not int(flags) & _NON_BLOCKING)
        self._streams[handle] = stream
        self.scheduler.streams.append(stream)
        return (handle,)

    def cudaStreamDestroy(self, stream: Any) -> tuple[Any, ...]:
        """Forget the handle; its queued work still runs."""
        return self._call("cudaStreamDestroy", self._stream_destroy, stream)

    def _stream_destroy(self, handle: Any) -> tuple[()]:
        if int(handle) not in self._streams:
            raise Failure(cudaError_t.cudaErrorInvalidResourceHandle)
        del self._streams[int(handle)]
        return ()

    def cudaStreamSynchronize(self, stream: Any) -> tuple[Any, ...]:
        """Run the stream's queued work (and what it waits for)."""
        return self._call("cudaStreamSynchronize", self._stream_sync, stream)

    def _stream_sync(self, handle: Any) -> tuple[()]:
        self.sync_stream(self.stream(handle))
        return ()

    def cudaStreamQuery(self, stream: Any) -> tuple[Any, ...]:
        """Success when the stream is idle, else cudaErrorNotReady."""
        return self._call("cudaStreamQuery", self._stream_query, stream)

    def _stream_query(self, handle: Any) -> tuple[()]:
        stream = self.stream(handle)
        if stream.done < stream.queued:
            raise Failure(cudaError_t.cudaErrorNotReady)
        self.scheduler.seen(stream, stream.queued)
        return ()

    def cudaStreamWaitEvent(self, stream: Any, event: Any, flags: int = 0) -> tuple[Any, ...]:
        """Later work on ``stream`` waits for the event's recorded position (any device)."""
        return self._call("cudaStreamWaitEvent", self._stream_wait, stream, event)

    def _stream_wait(self, handle: Any, event_handle: Any) -> tuple[()]:
        stream, event = self.stream(handle), self._event(event_handle)
        if event.mark is not None:
            source, seq, clock = event.mark
            self.enqueue(stream, Op("wait", after={source: seq}), inherited=clock)
        return ()

    # --- events --------------------------------------------------------------------------------

    def cudaEventCreateWithFlags(self, flags: int) -> tuple[Any, ...]:
        """An event of the current device."""
        return self._call("cudaEventCreateWithFlags", self._event_create)

    def _event_create(self) -> tuple[int]:
        handle = next(self._handles)
        self._events[handle] = SimEvent(handle, self._current())
        return (handle,)

    def cudaEventRecord(self, event: Any, stream: Any) -> tuple[Any, ...]:
        """Mark the stream's current end; fails on another device's stream."""
        return self._call("cudaEventRecord", self._event_record, event, stream)

    def _event_record(self, event_handle: Any, handle: Any) -> tuple[()]:
        event, stream = self._event(event_handle), self.stream(handle)
        if stream.device != event.device:
            raise Failure(cudaError_t.cudaErrorInvalidResourceHandle)
        op = self.enqueue(stream, Op("record"))
        event.mark = (stream, op.seq, op.clock)
        return ()

    def cudaEventQuery(self, event: Any) -> tuple[Any, ...]:
        """Success once reached, else cudaErrorNotReady."""
        return self._call("cudaEventQuery", self._event_query, event, context=False)

    def _event_query(self, handle: Any) -> tuple[()]:
        event = self._event(handle)
        if not event.reached():
            raise Failure(cudaError_t.cudaErrorNotReady)
        if event.mark is not None:
            self.scheduler.seen(*event.mark)
        return ()

    def cudaEventSynchronize(self, event: Any) -> tuple[Any, ...]:
        """Run work until the event is reached."""
        return self._call("cudaEventSynchronize", self._event_sync, event, context=False)

    def _event_sync(self, handle: Any) -> tuple[()]:
        event = self._event(handle)
        if event.mark is not None:
            source, seq, clock = event.mark
            if not self.scheduler.run_until(lambda: source.done >= seq):
                raise Failure(cudaError_t.cudaErrorNotReady)
            self.scheduler.seen(source, seq, clock)
            self._check_sticky(source.device)
        return ()

    def cudaEventDestroy(self, event: Any) -> tuple[Any, ...]:
        """Forget the event."""
        return self._call("cudaEventDestroy", self._event_destroy, event, context=False)

    def _event_destroy(self, handle: Any) -> tuple[()]:
        self._event(handle)
        del self._events[int(handle)]
        return ()
