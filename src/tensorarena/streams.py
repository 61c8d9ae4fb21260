"""Streams, events and fences: the ordering that lets a freed block be reused safely.

A *stream* runs the work submitted to it in order, asynchronously to the thread that submitted
it; an *event* marks a point in a stream and tells when every piece of work submitted before it
has finished. That is CUDA's model, and the source document's "interaction with asynchronous
execution": a block freed while work that uses it is still queued may be reused at once *on the
same stream* (stream order runs the new user after the old one), but by another stream only
after the event of the freeing stream has completed (or once that stream has been told to wait
for it).

Three small protocols say what the layers above need, so the same logic runs over CUDA streams
on a GPU and over :class:`CpuStream` everywhere (which is how it is tested without a GPU):

``Event``        ``query() -> bool`` (completed?), ``synchronize()`` (block until it is)
``StreamLike``   ``record() -> Event``, ``wait(event)`` (later work waits), ``synchronize()``
``EventSource``  ``record(stream) -> Event`` and ``wait(stream, event)`` for stream *handles*
                 that have no methods (CUDA's raw ``cudaStream_t`` integers, say)

:class:`CpuStream` is a real stream: one worker thread executes submitted callables in order and
hands out :class:`Fence` objects (its events). Work that raises does not stop the stream; the
exception is kept and raised by the next :meth:`CpuStream.synchronize` as
:class:`~tensorarena.errors.AsyncWorkError`, so a failure is never silently lost. The worker holds
no reference to its stream, so a stream that is garbage-collected stops its thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from tensorarena.errors import AsyncWorkError, InvalidArgumentError, StreamClosedError

__all__ = [
    "CpuStream",
    "Event",
    "EventSource",
    "Fence",
    "StreamLike",
    "StreamMethods",
    "check_event",
    "completed",
]


@runtime_checkable
class Event(Protocol):
    """A point in a stream's work."""

    def query(self) -> bool:
        """True once every piece of work submitted before this point has finished."""
        ...

    def synchronize(self) -> None:
        """Block the calling thread until :meth:`query` would return True."""
        ...


@runtime_checkable
class StreamLike(Protocol):
    """A stream object that records its own events and waits on others."""

    def record(self) -> Event:
        """An event at the current end of this stream's work."""
        ...

    def wait(self, event: Event) -> None:
        """Make every piece of work submitted from now on wait for ``event`` (the host does
        not block)."""
        ...

    def synchronize(self) -> None:
        """Block until all work submitted so far has finished."""
        ...


class EventSource(Protocol):
    """Records events on, and makes waits for, streams given as handles."""

    def record(self, stream: Any) -> Event:
        """An event at the current end of ``stream``'s work."""
        ...

    def wait(self, stream: Any, event: Event) -> None:
        """Make later work on ``stream`` wait for ``event``."""
        ...


class StreamMethods:
    """The :class:`EventSource` for stream objects that do it themselves (:class:`CpuStream`,
    the CUDA layer's ``CudaStream``): ``stream.record()`` and ``stream.wait(event)``."""

    def record(self, stream: Any) -> Event:
        """``stream.record()``."""
        return stream.record()  # type: ignore[no-any-return]

    def wait(self, stream: Any, event: Event) -> None:
        """``stream.wait(event)``."""
        stream.wait(event)

    def __repr__(self) -> str:
        return "StreamMethods()"


class Fence:
    """An event of a :class:`CpuStream`: set once the work before it has run.

    A fence made by :meth:`CpuStream.submit` also carries the outcome of its piece of work:
    :attr:`exception` is what it raised (``None`` if it returned).
    """

    __slots__ = ("_done", "_label", "exception")

    def __init__(self, label: str = "") -> None:
        self._done = threading.Event()
        self._label = label
        self.exception: BaseException | None = None

    def query(self) -> bool:
        """True once the work before this fence has run."""
        return self._done.is_set()

    def synchronize(self, timeout: float | None = None) -> None:
        """Block until the fence is reached; ``TimeoutError`` if ``timeout`` seconds pass."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self!r} not reached within {timeout} s")

    @property
    def done(self) -> bool:
        """Same as :meth:`query`."""
        return self._done.is_set()

    def _set(self) -> None:
        self._done.set()

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "pending"
        return f"Fence({self._label}, {state})"


def check_event(event: object) -> Event:
    """Return ``event`` if it can be waited for (it has ``synchronize()``), else raise
    :class:`~tensorarena.errors.InvalidArgumentError`: what every ``wait(event)`` checks."""
    if not callable(getattr(event, "synchronize", None)):
        raise InvalidArgumentError(
            f"wait() needs an event (with synchronize()), not {type(event).__name__}"
        )
    return event  # type: ignore[return-value]


def completed() -> Fence:
    """A fence that is already reached (the event of work that is known to be finished)."""
    fence = Fence("completed")
    fence._set()
    return fence


_STOP = object()
_names = itertools.count()


class _Shared:
    """What the worker and the stream share: the queue and the failures not yet reported.
    Kept apart from :class:`CpuStream` so the worker thread holds no reference to the stream."""

    __slots__ = ("errors", "lock", "queue")

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()


def _work(shared: _Shared) -> None:
    get = shared.queue.get
    while True:
        item = get()
        if item is _STOP:
            return
        fn, args, kwargs, fence = item
        if fn is not None:
            try:
                fn(*args, **kwargs)
            except BaseException as exc:  # kept for synchronize(): the stream runs on
                fence.exception = exc
                with shared.lock:
                    shared.errors.append(exc)
        fence._set()


def _stop(shared: _Shared) -> None:
    shared.queue.put(_STOP)


class CpuStream:
    """A stream of work on the CPU: one worker thread runs submitted callables in order.

    ``submit(fn, *args)`` returns at once with the :class:`Fence` of that piece of work;
    ``record()`` returns a fence at the current end of the stream; ``wait(event)`` makes later
    work wait for an event of any kind (another stream's fence, a CUDA event);
    ``synchronize()`` blocks until everything submitted has run and raises
    :class:`~tensorarena.errors.AsyncWorkError` if any of it raised since the last call.
    ``close()`` (or leaving ``with CpuStream() as s:``) finishes the queued work and stops the
    thread; a closed stream refuses new work (``submit``, ``wait``) with
    :class:`~tensorarena.errors.StreamClosedError`.
    """

    def __init__(self, name: str | None = None) -> None:
        self._name = name if name is not None else f"cpu-stream-{next(_names)}"
        self._shared = _Shared()
        self._last: Fence = completed()
        self._closed = False
        self._lock = threading.Lock()  # orders submissions from several threads
        self._thread = threading.Thread(
            target=_work, args=(self._shared,), name=self._name, daemon=True
        )
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._shared)

    @property
    def name(self) -> str:
        """The stream's name (also its worker thread's)."""
        return self._name

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Fence:
        """Queue ``fn(*args, **kwargs)`` after all earlier work; return its fence."""
        if not callable(fn):
            raise InvalidArgumentError(f"work must be callable, not {type(fn).__name__}")
        return self._put(fn, args, kwargs, "work")

    def record(self) -> Fence:
        """A fence reached once every piece of work submitted so far has run.

        A closed stream still answers (recording is no work): with its last piece of work's
        fence, so a block freed on it, or declared used on it, can still be freed.
        """
        try:
            return self._put(None, (), {}, "record")
        except StreamClosedError:  # closed for good: its last fence no longer moves
            return self._last

    def wait(self, event: Event) -> None:
        """Make all work submitted from now on wait until ``event`` completes.

        Waiting on this stream's own fence is a no-op (its work runs in order anyway).
        """
        check_event(event)
        if isinstance(event, Fence) and event.query():
            return
        self._put(event.synchronize, (), {}, "wait")

    def query(self) -> bool:
        """True when every piece of work submitted so far has run."""
        return self._last.query()

    def synchronize(self) -> None:
        """Block until all submitted work has run; raise AsyncWorkError if any of it raised."""
        self._last.synchronize()
        with self._shared.lock:
            errors, self._shared.errors = self._shared.errors, []
        if errors:
            raise AsyncWorkError(
                f"{len(errors)} piece(s) of work on {self._name} raised; the first: "
                f"{type(errors[0]).__name__}: {errors[0]}",
                errors=errors,
            ) from errors[0]

    def close(self) -> None:
        """Run the queued work to its end and stop the worker. Closing twice is harmless;
        failures not yet reported are raised here as by :meth:`synchronize`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer()
        self._thread.join()
        self.synchronize()

    def __enter__(self) -> CpuStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("idle" if self.query() else "busy")
        return f"CpuStream({self._name!r}, {state})"

    def _put(
        self, fn: Callable[..., Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any],
        label: str,
    ) -> Fence:
        fence = Fence(f"{self._name}:{label}")
        with self._lock:
            if self._closed:
                raise StreamClosedError(f"{self._name} is closed: it takes no new work")
            self._shared.queue.put((fn, args, kwargs, fence))
            self._last = fence
        return fence
