"""RMM's logging CSV, both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from _traces import canonical, random_trace

from tensorarena.trace import MalformedTraceError, detect_format, iter_rmm, read_trace, write_rmm
from tensorarena.trace.rmm_format import RmmReadStats

# What rmm::mr::logging_resource_adaptor writes (spdlog's "%t,%H:%M:%S.%f,%v"), addresses reused.
RMM_LOG = """Thread,Time,Action,Pointer,Size,Stream
140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0x0
140573312345856,23:59:59.999500,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,00:00:00.000100,free,0x7f8a40000000,1024,0x0
140573312345856,00:00:00.000200,allocate failure,0x0,99999999999,0x0
140573312345856,00:00:00.000300,allocate,0x7f8a40000000,512,0x0
140573312345856,00:00:00.000400,free,0x7f8a40000400,2048,0x7f8a38001020
"""


def test_an_rmm_log_reads_as_events_with_ids_in_allocation_order() -> None:
    stats = RmmReadStats()
    events = list(iter_rmm(RMM_LOG, stats=stats))
    assert [(e.op, e.id, e.nbytes) for e in events] == [
        ("a", 0, 1024), ("a", 1, 2048), ("f", 0, 1024), ("a", 2, 512), ("f", 1, 2048)]
    assert events[1].stream == 0x7F8A38001020 and stats.failures == 1
    times = [e.time_us for e in events]
    assert times == sorted(times)  # past midnight the clock keeps counting up
    assert times[2] - times[0] == 1100


def test_detected_by_its_header_and_read_whole() -> None:
    assert detect_format(RMM_LOG) == "rmm"
    trace = read_trace(RMM_LOG)
    assert trace.metadata == {"format": "rmm", "allocate_failures": "1"}
    assert trace.summary().live_at_end_blocks == 1


def test_epoch_seconds_are_read_too() -> None:
    log = ("Thread,Time,Action,Pointer,Size,Stream\n"
           "1,1634567890.123456,allocate,7f00,10,0\n1,1634567890.5,free,7f00,10,0\n")
    events = list(iter_rmm(log))
    assert events[1].time_us - events[0].time_us == 376544


def test_round_trip_preserves_the_event_stream(tmp_path: Path) -> None:
    trace = random_trace(500, streams=3)
    write_rmm(trace, tmp_path / "log.csv")
    back = read_trace(tmp_path / "log.csv")
    assert canonical(list(back)) == canonical(list(trace))
    assert [e.time_us for e in back] == [e.time_us for e in trace]
    assert (tmp_path / "log.csv").read_text().startswith("Thread,Time,Action,Pointer,Size,"
                                                         "Stream\n0,00:00:00.000000,allocate,")


@pytest.mark.parametrize(
    ("row", "column", "words"),
    [
        ("1,00:00:00.1,allocate,0xzz,10,0x0", "Pointer", "hexadecimal"),
        ("1,00:00:00.1,allocate,0x10,ten,0x0", "Size", "not an integer"),
        ("1,noon,allocate,0x10,10,0x0", "Time", "HH:MM:SS"),
        ("1,00:00:00.1,grab,0x10,10,0x0", "Action", "neither"),
        ("1,00:00:00.1,free,0x10,10,0x0", "Pointer", "truncated"),
        ("1,00:00:00.1,allocate,0x10,10", None, "5 fields"),
    ],
)
def test_malformed_rows_name_their_line(row: str, column: str | None, words: str) -> None:
    with pytest.raises(MalformedTraceError, match=words) as info:
        list(iter_rmm(f"Thread,Time,Action,Pointer,Size,Stream\n{row}\n"))
    assert (info.value.line, info.value.column) == (2, column)


def test_a_second_allocate_at_a_live_address_is_refused() -> None:
    log = ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01.0,allocate,0x10,10,0x0\n"
           "1,00:00:01.0,allocate,0x10,10,0x0\n")
    with pytest.raises(MalformedTraceError, match="still live") as info:
        list(iter_rmm(log))
    assert info.value.line == 3


def test_a_file_that_is_not_an_rmm_log() -> None:
    with pytest.raises(MalformedTraceError, match="missing column"):
        list(iter_rmm("op,id,size\na,0,1\n"))
