"""CpuStream and its fences: work in order, off the calling thread; failures reported, not lost."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from tensorarena.errors import AsyncWorkError, InvalidArgumentError, StreamClosedError
from tensorarena.streams import CpuStream, Event, Fence, StreamLike, StreamMethods, completed


def test_work_runs_in_order_on_another_thread() -> None:
    seen: list[tuple[int, str]] = []
    with CpuStream("s") as stream:
        for i in range(50):
            stream.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
        stream.synchronize()
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"s"}


def test_submit_returns_before_the_work_runs_and_the_fence_tells_when_it_has() -> None:
    gate = threading.Event()
    with CpuStream() as stream:
        fence = stream.submit(gate.wait)
        after = stream.record()
        assert not fence.query() and not after.query() and not stream.query()
        gate.set()
        after.synchronize(timeout=5)
        assert fence.query() and after.done and stream.query()
        assert isinstance(fence, Event) and isinstance(stream, StreamLike)


def test_a_fence_times_out_instead_of_hanging() -> None:
    gate = threading.Event()
    with CpuStream() as stream:
        fence = stream.submit(gate.wait)
        with pytest.raises(TimeoutError):
            fence.synchronize(timeout=0.01)
        gate.set()


def test_failures_are_kept_and_raised_by_synchronize_and_the_stream_runs_on() -> None:
    ran: list[int] = []
    with CpuStream() as stream:
        bad = stream.submit(lambda: 1 / 0)
        stream.submit(ran.append, 1)
        with pytest.raises(AsyncWorkError) as error:
            stream.synchronize()
        assert isinstance(error.value.errors[0], ZeroDivisionError)
        assert isinstance(bad.exception, ZeroDivisionError)
        assert ran == [1]
        stream.synchronize()  # reported once


def test_wait_orders_work_across_streams() -> None:
    order: list[str] = []
    gate = threading.Event()
    with CpuStream() as first, CpuStream() as second:
        first.submit(gate.wait)
        first.submit(order.append, "first")
        second.wait(first.record())
        second.submit(order.append, "second")
        time.sleep(0.02)
        assert order == []  # the second stream is held by the first's event
        gate.set()
        second.synchronize()
    assert order == ["first", "second"]


def test_waiting_on_a_reached_fence_costs_nothing_and_non_events_are_refused() -> None:
    with CpuStream() as stream:
        stream.wait(completed())
        assert stream.query()
        with pytest.raises(InvalidArgumentError):
            stream.wait(object())  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            stream.submit(42)  # type: ignore[arg-type]


def test_a_closed_stream_refuses_work_and_close_finishes_the_queue() -> None:
    ran: list[int] = []
    stream = CpuStream()
    stream.submit(time.sleep, 0.01)
    stream.submit(ran.append, 1)
    stream.close()
    assert ran == [1] and stream.closed and "closed" in repr(stream)
    with pytest.raises(StreamClosedError):
        stream.submit(ran.append, 2)
    with pytest.raises(StreamClosedError):
        stream.wait(Fence("pending"))
    # Recording is no work: a closed stream's event is its last work's fence, reached.
    assert stream.record().query()
    stream.close()


def test_a_collected_stream_stops_its_thread() -> None:
    stream = CpuStream("collected")
    thread = stream._thread
    stream.synchronize()
    del stream
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_fences_and_stream_methods() -> None:
    fence = Fence("x")
    assert not fence.query() and "pending" in repr(fence)
    assert completed().query() and "done" in repr(completed())
    with CpuStream() as stream:
        events = StreamMethods()
        event = events.record(stream)
        events.wait(stream, event)
        stream.synchronize()
        assert event.query()
