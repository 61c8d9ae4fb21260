"""StreamOrdered over real memory and real CPU streams: a freed block is never handed to work
that could run while the work that used it is still running (patterns written and checked)."""

from __future__ import annotations

import ctypes
import random
import threading
import time

import pytest

from tensorarena.adaptors import StreamOrdered
from tensorarena.errors import (
    AsyncWorkError,
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    OutOfMemoryError,
    SizeMismatchError,
)
from tensorarena.memory import Fixed, HostMemory, Pool
from tensorarena.streams import CpuStream, Fence, completed

KiB = 1024


def _pool(size: int = 256 * KiB, *, limit: bool = False) -> Pool:
    return Pool(
        HostMemory(),
        initial_size=size,
        maximum_size=size if limit else None,
        growth=Fixed() if limit else None,
    )


def _fill(address: int, nbytes: int, byte: int) -> None:
    ctypes.memset(address, byte, nbytes)


def _check(address: int, nbytes: int, byte: int, what: str) -> None:
    found = ctypes.string_at(address, nbytes)
    if found != bytes([byte]) * nbytes:
        wrong = next(i for i, b in enumerate(found) if b != byte)
        raise AssertionError(f"{what}: byte {wrong} is {found[wrong]}, expected {byte}")


def _use(address: int, nbytes: int, byte: int, *, hold: float = 0.0,
         gate: threading.Event | None = None, started: threading.Event | None = None) -> None:
    """Work on a stream: write a pattern, keep using the block for a while, check it."""
    _fill(address, nbytes, byte)
    if started is not None:
        started.set()
    if gate is not None:
        gate.wait(timeout=2)
    elif hold:
        time.sleep(hold)
    _check(address, nbytes, byte, f"block {address:#x} (pattern {byte})")


def test_a_block_freed_on_a_stream_is_reused_at_once_by_that_stream() -> None:
    resource = StreamOrdered(_pool())
    gate = threading.Event()
    with CpuStream() as stream:
        first = resource.allocate(4096, stream=stream)
        stream.submit(_use, first, 4096, 1, gate=gate)
        resource.deallocate(first, 4096, stream)  # the work above has not run yet
        second = resource.allocate(4096, stream=stream)
        assert second == first, "stream order makes the same stream's reuse safe"
        stream.submit(_use, second, 4096, 2)  # runs after the first user's work
        gate.set()
        stream.synchronize()
        resource.deallocate(second, 4096, stream)
    stats = resource.statistics()
    assert stats.same_stream_reuses == 1 and stats.allocations.current == 0


def test_another_stream_never_gets_a_block_whose_work_is_still_queued() -> None:
    resource = StreamOrdered(_pool())
    gate = threading.Event()
    with CpuStream() as first, CpuStream() as second:
        block = resource.allocate(4096, stream=first)
        first.submit(_use, block, 4096, 1, gate=gate)
        resource.deallocate(block, 4096, first)
        other = resource.allocate(4096, stream=second)
        assert other != block
        second.submit(_use, other, 4096, 2)
        stats = resource.statistics()
        assert stats.waiting_blocks == 1 and stats.active_bytes.current == 2 * 4096
        gate.set()
        first.synchronize()
        resource.deallocate(other, 4096, second)
        second.synchronize()
        again = resource.allocate(4096)  # events done: given back, first fit
        assert again == block
        resource.deallocate(again, 4096, second)
        assert resource.synchronize() == 4096
    stats = resource.statistics()
    assert stats.waiting_blocks == 0 and stats.released_blocks >= 1
    assert stats.active_bytes.current == 0


@pytest.mark.parametrize("ordered", [True, False], ids=["stream-ordered", "bare-pool-control"])
def test_the_pattern_check_catches_reuse_under_running_work(ordered: bool) -> None:
    """The control proves the check has teeth: over a bare pool the second stream writes into
    the block while the first stream's work still uses it, and the check fails."""
    pool = _pool()
    resource = StreamOrdered(pool) if ordered else pool
    gate, started = threading.Event(), threading.Event()
    with CpuStream() as first, CpuStream() as second:
        block = resource.allocate(4096, 256, first)
        first.submit(_use, block, 4096, 1, gate=gate, started=started)
        resource.deallocate(block, 4096, first)
        assert started.wait(timeout=2)  # the first stream's work is under way
        other = resource.allocate(4096, 256, second)
        second.submit(_fill, other, 4096, 2)
        second.submit(gate.set)
        second.synchronize()
        if ordered:
            first.synchronize()
        else:
            assert other == block
            with pytest.raises(AsyncWorkError, match="pattern 1"):
                first.synchronize()
        resource.deallocate(other, 4096, second)


def test_real_concurrent_work_on_three_streams_never_shares_a_live_block() -> None:
    rng = random.Random(12)
    resource = StreamOrdered(_pool(128 * KiB, limit=True))
    streams = [CpuStream(f"worker-{i}") for i in range(3)]
    live: list[tuple[int, int, CpuStream]] = []
    try:
        for step in range(300):
            stream = rng.choice(streams)
            nbytes = rng.choice([512, 4096, 6000, 16 * KiB, rng.randrange(256, 24 * KiB)])
            address = resource.allocate(nbytes, stream=stream)
            stream.submit(_use, address, nbytes, step % 250 + 1, hold=rng.random() * 0.002)
            live.append((address, nbytes, stream))
            while len(live) > rng.randrange(1, 5):  # free at once: the work may not have run
                resource.deallocate(*live.pop(rng.randrange(len(live))))
        for block in live:
            resource.deallocate(*block)
        for stream in streams:
            stream.synchronize()  # raises AsyncWorkError if any check failed
    finally:
        for stream in streams:
            stream.close()
    stats = resource.statistics()
    assert stats.same_stream_reuses > 0, "the test must exercise immediate reuse"
    assert stats.released_blocks + stats.waited_reuses > 0, "and reuse across streams"
    assert stats.allocations.current == 0
    resource.synchronize()
    assert resource.statistics().waiting_bytes == 0
    assert resource.upstream.statistics().allocations.current == 0  # type: ignore[attr-defined]


def test_out_of_memory_hands_a_waiting_block_over_by_making_the_stream_wait() -> None:
    resource = StreamOrdered(_pool(64 * KiB, limit=True))
    gate = threading.Event()
    order: list[str] = []
    with CpuStream() as first, CpuStream() as second:
        block = resource.allocate(64 * KiB, stream=first)
        first.submit(_use, block, 64 * KiB, 1, gate=gate)
        first.submit(order.append, "first done")
        resource.deallocate(block, 64 * KiB, first)
        taken = resource.allocate(64 * KiB, stream=second)  # the pool is full: wait, not fail
        assert taken == block
        second.submit(order.append, "second starts")
        second.submit(_use, taken, 64 * KiB, 2)
        time.sleep(0.02)
        assert order == []  # the second stream is held back by the first one's event
        gate.set()
        second.synchronize()
        assert order == ["first done", "second starts"]
        resource.deallocate(taken, 64 * KiB, second)
    assert resource.statistics().waited_reuses == 1


def test_a_synchronous_caller_at_out_of_memory_waits_for_the_events_on_the_host() -> None:
    resource = StreamOrdered(_pool(64 * KiB, limit=True))
    gate = threading.Event()
    with CpuStream() as stream:
        block = resource.allocate(64 * KiB, stream=stream)
        stream.submit(_use, block, 64 * KiB, 1, gate=gate)
        resource.deallocate(block, 64 * KiB, stream)
        threading.Timer(0.05, gate.set).start()
        again = resource.allocate(64 * KiB)  # stream None: synchronous, so the host waits
        assert again == block and gate.is_set()
        resource.deallocate(again, 64 * KiB)
        with pytest.raises(OutOfMemoryError):
            resource.allocate(128 * KiB)
    stats = resource.statistics()
    assert stats.host_waits == 1 and stats.num_ooms == 1 and stats.waiting_blocks == 0


def test_record_stream_holds_the_block_for_every_stream_that_used_it() -> None:
    resource = StreamOrdered(_pool())
    gate = threading.Event()
    with CpuStream() as first, CpuStream() as second:
        block = resource.allocate(4096, stream=first)
        resource.record_stream(block, second)
        resource.record_stream(block, second)  # once is enough
        second.submit(_use, block, 4096, 1, gate=gate)  # the other stream reads it
        resource.deallocate(block, 4096, first)
        again = resource.allocate(4096, stream=first)
        assert again != block, "the second stream is still using it"
        gate.set()
        second.synchronize()
        reused = resource.allocate(4096, stream=first)
        assert reused == block
        for address in (again, reused):
            resource.deallocate(address, 4096, first)
        with pytest.raises(InvalidAddressError):
            resource.record_stream(block, second)  # not live any more
        live = resource.allocate(64, stream=first)
        with pytest.raises(InvalidAddressError):
            resource.record_stream(live, None)
        resource.deallocate(live, 64, first)


def test_bad_frees_change_nothing_and_a_waiting_block_is_a_double_free() -> None:
    resource = StreamOrdered(_pool())
    gate = threading.Event()
    with CpuStream() as stream:
        block = resource.allocate(4096, stream=stream)
        stream.submit(gate.wait, 2)
        resource.deallocate(block, 4096, stream)
        keep = resource.allocate(100, stream=None)
        before = resource.statistics(), resource.live_blocks()
        with pytest.raises(DoubleFreeError):
            resource.deallocate(block, 4096, stream)
        with pytest.raises(SizeMismatchError):
            resource.deallocate(keep, 99)
        with pytest.raises(InvalidAddressError):
            resource.deallocate(keep + 8, 100)
        assert (resource.statistics(), resource.live_blocks()) == before
        gate.set()
        resource.deallocate(keep, 100)


class _FailingEvents:
    def record(self, stream: object) -> Fence:
        raise RuntimeError("driver refused to record")

    def wait(self, stream: object, event: object) -> None:
        raise AssertionError("not reached")


def test_an_event_that_cannot_be_recorded_leaves_the_block_live() -> None:
    resource = StreamOrdered(_pool(), events=_FailingEvents(), default_stream="s")
    block = resource.allocate(4096)
    with pytest.raises(RuntimeError, match="refused"):
        resource.deallocate(block, 4096)
    assert resource.live_blocks() == {block: 4096}


class _RecordedEvents:
    """An event source over plain handles (strings), as for CUDA's raw stream integers."""

    def __init__(self) -> None:
        self.recorded: list[object] = []

    def record(self, stream: object) -> Fence:
        self.recorded.append(stream)
        return completed()

    def wait(self, stream: object, event: object) -> None:
        raise AssertionError("completed events are never waited on")


def test_default_stream_and_event_sources_for_stream_handles() -> None:
    events = _RecordedEvents()
    resource = StreamOrdered(_pool(), events=events, default_stream="main")
    assert resource.default_stream == "main"
    block = resource.allocate(4096)
    resource.deallocate(block, 4096)  # on "main"
    assert events.recorded == ["main"]
    assert resource.allocate(4096) == block  # same stream, at once
    resource.deallocate(block, 4096, "side")
    assert resource.release_completed() == 4096
    assert "waiting=0" in repr(resource)
    resource.reset_peak_stats()
    assert resource.statistics().active_bytes.peak == 0


@pytest.mark.parametrize("stream", ["cuda:0", [1], 3.5])
def test_a_stream_it_cannot_record_on_is_refused_before_any_block_is_handed_out(
    stream: object,
) -> None:
    # A block handed out on (or declared used on) such a stream could never be freed on it:
    # the free records an event there. Refused up front, with nothing handed out.
    pool = _pool()
    ordered = StreamOrdered(pool)
    with pytest.raises(InvalidArgumentError):
        ordered.allocate(64, stream=stream)
    address = ordered.allocate(64)
    with pytest.raises(InvalidArgumentError):
        ordered.record_stream(address, stream)
    with pytest.raises(InvalidArgumentError):
        ordered.deallocate(address, 64, stream=stream)
    ordered.deallocate(address, 64)  # none of the refused calls left a stream on the block
    assert ordered.live_blocks() == {} and pool.statistics().allocations.current == 0


def test_a_block_used_on_a_stream_closed_since_can_still_be_freed() -> None:
    pool = _pool()
    ordered = StreamOrdered(pool)
    with CpuStream() as used, CpuStream() as freeing:
        on_used = ordered.allocate(64, stream=used)
        declared = ordered.allocate(64, stream=freeing)
        ordered.record_stream(declared, used)
    ordered.deallocate(on_used, 64, stream=used)  # both streams are closed by now
    ordered.deallocate(declared, 64, stream=freeing)
    assert ordered.synchronize() == 128
    assert ordered.live_blocks() == {} and pool.statistics().allocations.current == 0


def test_events_and_a_default_stream_it_cannot_use_are_refused_when_it_is_made() -> None:
    # Both were accepted, and the first free on them raised AttributeError.
    with pytest.raises(InvalidArgumentError, match="EventSource"):
        StreamOrdered(_pool(), events=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="no record"):
        StreamOrdered(_pool(), default_stream="cuda:0")
