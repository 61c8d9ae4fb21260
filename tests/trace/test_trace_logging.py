"""The Logging adaptor records every call; EventRecorder turns records into trace events."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from _traces import random_trace

from tensorarena.adaptors import Limiting, Logging, LogRecord
from tensorarena.errors import DoubleFreeError, InvalidArgumentError, OutOfMemoryError
from tensorarena.memory import Pool, VirtualMemory
from tensorarena.trace import (
    CsvWriter,
    EventRecorder,
    MalformedTraceError,
    read_trace,
    replay,
    trace_from_log,
)


def test_every_call_is_recorded_in_order() -> None:
    log = Logging(Pool(VirtualMemory()))
    a = log.allocate(100)
    b = log.allocate("1KiB", 512, stream=None)
    log.deallocate(a, 100)
    actions = [(r.action, r.address, r.nbytes) for r in log.records]
    assert actions == [("allocate", a, 100), ("allocate", b, 1024), ("free", a, 100)]
    times = [r.time_ns for r in log.records]
    assert times == sorted(times) and {r.thread for r in log.records} == {threading.get_ident()}
    assert len(log) == 3 and "records=3" in repr(log)
    log.clear()
    assert log.records == ()


def test_refused_calls_record_a_failure_or_nothing() -> None:
    log = Logging(Limiting(Pool(VirtualMemory()), 1000))
    with pytest.raises(OutOfMemoryError):
        log.allocate(2000)
    block = log.allocate(10)
    log.deallocate(block, 10)
    with pytest.raises(DoubleFreeError):
        log.deallocate(block, 10)
    assert [r.action for r in log.records] == ["allocate_failure", "allocate", "free"]
    assert log.memory_kind is VirtualMemory.memory_kind and log.upstream is not None


def test_a_log_becomes_a_trace_that_replays_to_the_same_peak() -> None:
    original = random_trace(600, seed=4, streams=1)
    log = Logging(Pool(VirtualMemory()))
    addresses = {}
    for event in original:
        if event.op == "a":
            addresses[event.id] = log.allocate(event.nbytes)
        else:
            log.deallocate(addresses.pop(event.id), event.nbytes)
    recorded = trace_from_log(log.records, name="again")
    assert [(e.op, e.nbytes) for e in recorded] == [(e.op, e.nbytes) for e in original]
    assert recorded.summary().peak_live_bytes == original.summary().peak_live_bytes
    assert replay(recorded, VirtualMemory()).peak_live_bytes == \
        original.summary().peak_live_bytes


def test_a_recording_streams_to_a_file_that_appears_when_it_ends(tmp_path: Path) -> None:
    target = tmp_path / "run.csv"
    with CsvWriter(target) as out:
        recorder = EventRecorder(out)
        resource = Logging(Pool(VirtualMemory()), sink=recorder)
        blocks = [resource.allocate(n) for n in (10, 20, 30)]
        resource.deallocate(blocks[1], 20)
        assert not target.exists() and resource.records == ()
    trace = read_trace(target)
    assert [(e.op, e.id, e.nbytes) for e in trace] == [
        ("a", 0, 10), ("a", 1, 20), ("a", 2, 30), ("f", 1, 20)]


def test_streams_become_small_numbers() -> None:
    recorder = EventRecorder()
    token = object()
    recorder(LogRecord("allocate", 16, 10, token, 1, 1000))
    recorder(LogRecord("allocate", 32, 10, 7, 1, 2000))
    recorder(LogRecord("allocate", 48, 10, None, 1, 3000))
    recorder(LogRecord("allocate_failure", 0, 10, None, 1, 3000))
    assert [e.stream for e in recorder.events] == [1, 7, 0]
    assert [e.time_us for e in recorder.events] == [0, 1, 2] and recorder.failures == 1
    with pytest.raises(MalformedTraceError, match="no recorded allocate"):
        recorder(LogRecord("free", 999, 10, None, 1, 4000))


def test_records_from_many_threads_stay_consistent() -> None:
    log = Logging(Pool(VirtualMemory()))

    def work() -> None:
        for _ in range(300):
            block = log.allocate(4096)
            log.deallocate(block, 4096)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trace = trace_from_log(log.records)  # checks: no address allocated while still live
    assert trace.summary().allocations == 1200 and trace.summary().live_at_end_blocks == 0


def test_a_sink_that_raises_on_an_allocate_leaves_nothing_allocated() -> None:
    records: list[LogRecord] = []

    def full_disk(record: LogRecord) -> None:
        if record.action == "allocate" and record.nbytes == 999:
            raise OSError(28, "No space left on device")
        records.append(record)

    pool = Pool(VirtualMemory())
    log = Logging(pool, sink=full_disk)
    kept = log.allocate(100)
    with pytest.raises(OSError, match="No space"):
        log.allocate(999)  # the caller never sees the address: it must not stay allocated
    assert pool.statistics().allocations.current == 1
    log.deallocate(kept, 100)
    assert pool.statistics().allocations.current == 0
    assert [(r.action, r.nbytes) for r in records] == [("allocate", 100), ("free", 100)]


def test_a_sink_that_cannot_be_called_is_refused_when_the_adaptor_is_made() -> None:
    # Logging(pool, sink=path) was accepted; every allocate then raised TypeError.
    with pytest.raises(InvalidArgumentError, match="sink must be a callable"):
        Logging(Pool(VirtualMemory()), sink="trace.csv")  # type: ignore[arg-type]
