"""``StreamOrdered``: a freed block is reused only when no queued work can still touch it.

With asynchronous execution, ``deallocate`` is called when the *host* is done with a block, while
kernels (or any work queued on a stream) that read or write it may not have run yet. Handing the
bytes to someone else at once would let the new owner's work race the old one's. This adaptor
implements the rule of CUDA's stream-ordered allocators (RMM's, PyTorch's caching allocator):

* ``deallocate(address, nbytes, stream)`` records an event on ``stream`` (and on every stream
  the block was declared used on with :meth:`StreamOrdered.record_stream`) and keeps the block
  on that stream's free list instead of giving it back;
* an allocation on the *same* stream may take such a block at once: the stream runs its work in
  order, so the new user's work starts after the old user's has finished;
* a block goes back to the upstream (where any stream may get it) only once its events have
  completed, checked whenever an allocation misses its stream's list;
* when the upstream is out of memory, a waiting block is handed to another stream by making that
  stream wait for the block's events (no host blocking); failing that, the host waits for every
  event, gives everything back, and retries once (PyTorch frees its cache and retries the same
  way).

``stream=None`` means ``default_stream`` (given at construction; ``None``: synchronous — a block
freed on it is given back at once, as by a host resource). Streams are opaque, hashable tokens:
stream objects with ``record()``/``wait()`` (:class:`~tensorarena.streams.CpuStream`, the CUDA
layer's ``CudaStream``) work as they are; raw handles need an ``events=``
:class:`~tensorarena.streams.EventSource` that can record on them.

A block is reused by a request of ``nbytes`` up to a quarter smaller than what it holds, so a
stream serves its own steady-state requests from its list without fragmenting the upstream.
Statistics speak :mod:`tensorarena.stats`: ``allocated_bytes`` are live blocks, ``active_bytes``
live blocks plus those waiting for their events (the word's meaning in PyTorch).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from tensorarena.errors import InvalidAddressError, InvalidArgumentError
from tensorarena.memory.live_blocks import LiveBlocks
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import (
    ALIGNMENTS,
    MAX_SIZE,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
)
from tensorarena.stats import Count
from tensorarena.streams import Event, EventSource, StreamMethods

__all__ = ["StreamOrdered", "StreamOrderedStatistics"]


@dataclass(frozen=True, slots=True)
class StreamOrderedStatistics:
    """A snapshot of a :class:`StreamOrdered` adaptor, in the words of :mod:`tensorarena.stats`.

    ``requested_bytes``/``allocated_bytes``/``allocations`` count live blocks (as requested, and
    as held from the upstream); ``active_bytes`` adds the blocks waiting for their events.
    """

    requested_bytes: Count
    allocated_bytes: Count
    active_bytes: Count
    allocations: Count
    waiting_bytes: int = 0  #: freed, held back until their events complete
    waiting_blocks: int = 0
    same_stream_reuses: int = 0  #: handed out again at once on the stream that freed them
    waited_reuses: int = 0  #: handed to another stream made to wait for their events
    released_blocks: int = 0  #: given back to the upstream once their events completed
    host_waits: int = 0  #: times the host blocked on events to find memory
    num_ooms: int = 0


class _Waiting:
    """A freed block held back: its owner stream may reuse it; everyone else waits for events."""

    __slots__ = ("address", "events", "held", "owner")

    def __init__(self, address: int, held: int, owner: Any, events: list[tuple[Any, Event]]):
        self.address = address
        self.held = held
        self.owner = owner
        self.events = events

    def complete(self) -> bool:
        return all(event.query() for _, event in self.events)

    def others_complete(self) -> bool:
        """Events on streams other than the owner (from record_stream) have completed."""
        return all(event.query() for stream, event in self.events if stream != self.owner)


class StreamOrdered(ResourceAdaptor):
    """Holds each freed block until the work queued before its free has finished."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        events: EventSource | None = None,
        default_stream: Stream = None,
    ) -> None:
        self._upstream = check_resource(upstream)
        if events is not None and not (callable(getattr(events, "record", None))
                                       and callable(getattr(events, "wait", None))):
            raise InvalidArgumentError(
                f"events must be an EventSource (record(stream), wait(stream, event)), not "
                f"{type(events).__name__}"
            )
        self._events: EventSource = StreamMethods() if events is None else events
        self._stream_types: set[type] = set()  # the kinds of stream _check_stream accepted
        if default_stream is not None:
            self._check_stream(default_stream)
        self._default = default_stream
        self._lock = threading.RLock()
        self._live = LiveBlocks("StreamOrdered")
        self._used_on: dict[int, list[Any]] = {}  # address -> extra streams (record_stream)
        self._by_stream: dict[Any, deque[_Waiting]] = {}
        self._waiting: dict[int, _Waiting] = {}
        self._waiting_bytes = 0
        self._active = self._peak_active = self._total_active = 0
        self._same = self._waited = self._released = self._host_waits = 0

    # --- properties ------------------------------------------------------------------------

    @property
    def default_stream(self) -> Stream:
        """The stream ``stream=None`` stands for (``None``: synchronous)."""
        return self._default

    # --- the resource protocol -------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A block for work on ``stream``: one it freed itself if one fits, else the upstream's."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment not in ALIGNMENTS:
            alignment = check_alignment(alignment)
        if stream is None:
            stream = self._default
        with self._lock:
            entry = None if stream is None else self._take_own(stream, nbytes, alignment)
            if entry is not None:  # already counted as active while it waited
                self._same += 1
                address, held = entry.address, entry.held
            else:
                if stream is not None and type(stream) not in self._stream_types:
                    self._check_stream(stream)
                address, held, fresh = self._from_upstream(nbytes, alignment, stream)
                if fresh:
                    self._add_active(held)
            self._live.add(address, nbytes, held)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Free the block for reuse after the work queued on ``stream`` so far has run.

        Raises :class:`DoubleFreeError` (also for a block still waiting for its event),
        :class:`InvalidAddressError` or :class:`SizeMismatchError`, changing nothing.
        """
        if stream is None:
            stream = self._default
        if stream is not None and type(stream) not in self._stream_types:
            self._check_stream(stream)
        with self._lock:
            address, (_, held, _) = self._live.lookup(address, nbytes)
            streams = [] if stream is None else [stream]
            for other in self._used_on.get(address, ()):
                if other not in streams:
                    streams.append(other)
            if not streams:
                self._upstream.deallocate(address, held, None)
                self._live.remove(address)
                self._add_active(-held)
                return
            # Record first: if the driver refuses, nothing has changed.
            events = [(s, self._events.record(s)) for s in streams]
            waiting = _Waiting(address, held, stream, events)
            self._by_stream.setdefault(stream, deque()).append(waiting)
            self._waiting[address] = waiting
            self._waiting_bytes += held
            self._used_on.pop(address, None)
            self._live.remove(address)

    # --- streams ---------------------------------------------------------------------------

    def record_stream(self, address: int, stream: Stream) -> None:
        """Declare that work on ``stream`` also uses the live block at ``address``: when it is
        freed, it also waits for that stream's work (``Tensor.record_stream`` in PyTorch).

        PyTorch's pluggable-allocator route (``TorchAllocator``) cannot call this for you: the
        interface has no ``record_stream`` hook, so a tensor used on a second stream must be
        declared here by the program, or synchronised before it dies."""
        address = check_address(address)
        with self._lock:
            if address not in self._live:
                raise self._live.not_live(address)
            if stream is None:
                raise InvalidAddressError(
                    "record_stream needs a stream (None is the synchronous default)",
                    address=address,
                )
            self._check_stream(stream)
            extra = self._used_on.setdefault(address, [])
            if stream not in extra:
                extra.append(stream)

    def release_completed(self) -> int:
        """Give back every waiting block whose events have completed; return the bytes."""
        with self._lock:
            return self._release_completed()

    def synchronize(self) -> int:
        """Wait (on the host) for every waiting block's events and give them all back; return
        the bytes given back. Call it before closing or trimming the upstream."""
        with self._lock:
            return self._drain()

    # --- queries ---------------------------------------------------------------------------

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes (waiting blocks are not live)."""
        with self._lock:
            return self._live.live_blocks()

    def statistics(self) -> StreamOrderedStatistics:
        """A frozen snapshot (see :class:`StreamOrderedStatistics`)."""
        with self._lock:
            live = self._live.statistics()
            return StreamOrderedStatistics(
                requested_bytes=live.requested_bytes,
                allocated_bytes=live.allocated_bytes,
                active_bytes=Count(self._active, self._peak_active, self._total_active),
                allocations=live.allocations,
                waiting_bytes=self._waiting_bytes,
                waiting_blocks=len(self._waiting),
                same_stream_reuses=self._same,
                waited_reuses=self._waited,
                released_blocks=self._released,
                host_waits=self._host_waits,
                num_ooms=live.num_ooms,
            )

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._live.reset_peaks()
            self._peak_active = self._active

    def __repr__(self) -> str:
        return (
            f"StreamOrdered({self._upstream!r}, live={len(self._live)}, "
            f"waiting={len(self._waiting)} ({format_size(self._waiting_bytes)}))"
        )

    # --- internals (under the lock) --------------------------------------------------------

    def _add_active(self, delta: int) -> None:
        self._active += delta
        if delta > 0:
            self._total_active += delta
            self._peak_active = max(self._peak_active, self._active)

    @staticmethod
    def _fits(waiting: _Waiting, nbytes: int, alignment: int) -> bool:
        return nbytes <= waiting.held <= nbytes + (nbytes >> 2) and not (
            waiting.address & (alignment - 1)
        )

    def _check_stream(self, stream: Any) -> None:
        """Refuse a stream this adaptor could not record on when the block is freed: a block
        handed out on it (or declared used on it) could then never be freed on it. Checked
        once per type of stream, so the allocation path pays a set lookup."""
        try:
            hash(stream)
        except TypeError:
            raise InvalidArgumentError(
                f"a stream must be hashable (it keys a free list), not {type(stream).__name__}"
            ) from None
        if type(self._events) is StreamMethods and not (
            callable(getattr(stream, "record", None)) and callable(getattr(stream, "wait", None))
        ):
            raise InvalidArgumentError(
                f"stream {stream!r} has no record()/wait(): pass a stream object (CpuStream, "
                "CudaStream), or give StreamOrdered an events= EventSource for raw handles"
            )
        self._stream_types.add(type(stream))

    def _take_own(self, stream: Any, nbytes: int, alignment: int) -> _Waiting | None:
        """The smallest fitting block this stream freed itself, if the streams it was also
        used on are done with it."""
        try:
            queue = self._by_stream.get(stream)
        except TypeError:
            self._check_stream(stream)
            raise
        if not queue:
            return None
        best: _Waiting | None = None
        for waiting in queue:
            if (
                self._fits(waiting, nbytes, alignment)
                and (best is None or waiting.held < best.held)
                and waiting.others_complete()
            ):
                best = waiting
        if best is not None:
            self._forget(best)
        return best

    def _from_upstream(
        self, nbytes: int, alignment: int, stream: Any
    ) -> tuple[int, int, bool]:
        """``(address, held, fresh)``: fresh when the upstream served it (not a waiting block)."""
        if self._waiting:
            self._release_completed()
        try:
            return self._upstream.allocate(nbytes, alignment, stream), nbytes, True
        except MemoryError:
            if not self._waiting:
                self._live.count_oom()
                raise
        stolen = None if stream is None else self._take_by_waiting(stream, nbytes, alignment)
        if stolen is not None:
            self._waited += 1
            return stolen.address, stolen.held, False
        self._drain()
        try:
            return self._upstream.allocate(nbytes, alignment, stream), nbytes, True
        except MemoryError:
            self._live.count_oom()
            raise

    def _take_by_waiting(self, stream: Any, nbytes: int, alignment: int) -> _Waiting | None:
        """A fitting block freed on another stream, handed over by making ``stream`` wait for
        its events (the host does not block)."""
        fitting = [w for w in self._waiting.values() if self._fits(w, nbytes, alignment)]
        if not fitting:
            return None
        best = min(fitting, key=lambda w: w.held)
        for _, event in best.events:
            if not event.query():
                self._events.wait(stream, event)
        self._forget(best)
        return best

    def _release_completed(self) -> int:
        released = 0
        for owner, queue in list(self._by_stream.items()):
            for waiting in list(queue):
                if waiting.complete():
                    released += self._give_back(waiting)
                elif owner is not None and waiting.events[0][0] == owner:
                    break  # a stream reaches its events in order: later ones are not done
        return released

    def _drain(self) -> int:
        if self._waiting:
            self._host_waits += 1
        released = 0
        for waiting in list(self._waiting.values()):
            for _, event in waiting.events:
                event.synchronize()
            released += self._give_back(waiting)
        return released

    def _give_back(self, waiting: _Waiting) -> int:
        self._upstream.deallocate(waiting.address, waiting.held, None)
        self._forget(waiting)
        self._released += 1
        self._add_active(-waiting.held)
        return waiting.held

    def _forget(self, waiting: _Waiting) -> None:
        queue = self._by_stream[waiting.owner]
        queue.remove(waiting)
        if not queue:
            del self._by_stream[waiting.owner]
        del self._waiting[waiting.address]
        self._waiting_bytes -= waiting.held
