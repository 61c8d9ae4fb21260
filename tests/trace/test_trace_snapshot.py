"""PyTorch memory snapshots both ways, opened by PyTorch's own viewer code; no code is run."""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import pickletools
from pathlib import Path
from typing import Any

import pytest
from _traces import canonical, random_events, random_trace

from tensorarena.trace import (
    MalformedTraceError,
    SnapshotAction,
    Trace,
    UnsafePickleError,
    build_snapshot,
    read_snapshot,
    read_trace,
    snapshot_of,
    write_snapshot,
)

#: The opcodes the memory_viz page's JavaScript unpickler implements (MemoryViz.js).
VIEWER_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST", "TUPLE", "TUPLE1",
    "TUPLE2", "TUPLE3", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "NONE", "NEWTRUE",
    "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE",
    "BINUNICODE",
}


def test_our_snapshot_opens_in_pytorchs_viewer_code(tmp_path: Path) -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz")
    trace = Trace.from_events(random_events(600, streams=2)[:600])  # some live at the end
    assert trace.summary().live_at_end_blocks
    write_snapshot(trace, tmp_path / "s.pickle")
    with open(tmp_path / "s.pickle", "rb") as handle:
        data = pickle.load(handle)
    summary = viz.segsum(data)  # asserts that every segment's blocks add up
    assert "total_reserved" in summary
    entries = data["device_traces"][0]
    assert f"{len(entries)} entries" in viz.trace(data)
    assert sum(e["action"] == "alloc" for e in entries) == trace.summary().allocations
    assert sum(e["action"] == "free_completed" for e in entries) == trace.summary().frees
    for html in (viz.trace_plot(data), viz.segment_plot(data)):
        assert "snapshot.pickle" in html
    lines = viz.memory(data, format_flamegraph=lambda text: text)
    assert "active_allocated" in lines
    viz.segments(data, format_flamegraph=lambda text: text)


def test_the_pickle_uses_only_opcodes_the_web_viewer_reads(tmp_path: Path) -> None:
    write_snapshot(random_trace(300), tmp_path / "s.pickle")
    used = {op.name for op, _, _ in pickletools.genops((tmp_path / "s.pickle").read_bytes())}
    assert used <= VIEWER_OPCODES, used - VIEWER_OPCODES
    assert (tmp_path / "s.pickle").read_bytes()[:2] == b"\x80\x04"  # protocol 4


def test_round_trip_preserves_the_event_stream(tmp_path: Path) -> None:
    trace = random_trace(500, streams=3)
    write_snapshot(trace, tmp_path / "s.pickle")
    back = read_trace(tmp_path / "s.pickle")
    assert canonical(list(back)) == canonical(list(trace))
    assert [(e.time_us, e.tag) for e in back] == [(e.time_us, e.tag) for e in trace]
    assert back.metadata["format"] == "pytorch_snapshot" and back.metadata["preexisting"] == "0"


def test_the_segments_follow_pytorchs_policy() -> None:
    trace = Trace.from_events([("a", 0, 100), ("a", 1, 3 << 20), ("a", 2, 30 << 20)])
    segments = snapshot_of(trace)["segments"]
    assert [(s["total_size"], s["segment_type"]) for s in segments] == [
        (2 << 20, "small"), (20 << 20, "large"), (30 << 20, "large")]
    first = segments[0]["blocks"]
    assert [(b["size"], b["requested_size"], b["state"]) for b in first] == [
        (512, 100, "active_allocated"), ((2 << 20) - 512, 0, "inactive")]


def _pytorch_style_snapshot() -> dict[str, Any]:
    """A snapshot shaped like torch.cuda.memory._snapshot()'s, with a bounded history: the block
    at 0x1000 was allocated before the history starts, 0x9000 stays active throughout."""
    frames = [{"filename": "train.py", "line": 3, "name": "forward"}]
    trace = [
        {"action": "segment_alloc", "addr": 0x1000, "size": 2 << 20, "stream": 0,
         "time_us": 1, "frames": frames},
        {"action": "alloc", "addr": 0x2000, "size": 512, "stream": 0, "time_us": 2,
         "frames": frames, "category": "activation"},
        {"action": "free_requested", "addr": 0x1000, "size": 1024, "stream": 0,
         "time_us": 3, "frames": frames},
        {"action": "free_completed", "addr": 0x1000, "size": 1024, "stream": 0,
         "time_us": 3, "frames": frames},
        {"action": "oom", "size": 1 << 40, "stream": 0, "device_free": 0, "frames": frames},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []},
        {"action": "free_requested", "addr": 0x2000, "size": 512, "stream": 0, "time_us": 4},
        {"action": "free_completed", "addr": 0x2000, "size": 512, "stream": 0, "time_us": 5},
    ]
    segment = {"device": 1, "address": 0x8000, "total_size": 4096, "stream": 0,
               "segment_type": "small", "allocated_size": 1024, "active_size": 1024,
               "blocks": [{"address": 0x8000, "size": 4096 - 1024, "state": "inactive",
                           "requested_size": 0, "frames": []},
                          {"address": 0x9000, "size": 1024, "state": "active_allocated",
                           "requested_size": 1000, "frames": frames}]}
    return {"segments": [segment], "device_traces": [[], trace]}


def test_reading_a_pytorch_snapshot_keeps_the_workload() -> None:
    trace = read_snapshot(io.BytesIO(pickle.dumps(_pytorch_style_snapshot())))
    assert [(e.op, e.nbytes, e.tag) for e in trace] == [
        ("a", 1024, ""), ("a", 1000, ""), ("a", 512, "activation"), ("f", 1024, ""),
        ("f", 512, "")]
    assert trace.events[0].time_us == 1  # preexisting blocks start with the history
    meta = trace.metadata
    assert (meta["device"], meta["preexisting"], meta["segment_actions"], meta["ooms"],
            meta["ignored_actions"]) == ("1", "2", "1", "1", "1")


def test_an_empty_history_or_several_devices_say_what_to_do() -> None:
    with pytest.raises(MalformedTraceError, match="_record_memory_history"):
        read_snapshot(io.BytesIO(pickle.dumps({"segments": [], "device_traces": [[]]})))
    both = {"segments": [], "device_traces": [
        [{"action": "alloc", "addr": 1, "size": 1}]] * 2}
    with pytest.raises(MalformedTraceError, match=r"devices \[0, 1\]"):
        read_snapshot(io.BytesIO(pickle.dumps(both)))
    assert len(read_snapshot(io.BytesIO(pickle.dumps(both)), device=1)) == 1
    with pytest.raises(MalformedTraceError, match="without history"):
        read_snapshot(io.BytesIO(pickle.dumps([{"address": 1}])))
    with pytest.raises(MalformedTraceError, match="'size' must be an int") as info:
        read_snapshot(io.BytesIO(pickle.dumps(
            {"device_traces": [[{"action": "alloc", "addr": 1, "size": "x"}]]})))
    assert info.value.line == 1


class _Exploit:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_pickle_that_would_run_a_command_is_refused_and_runs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[_Exploit()]]}, protocol=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsafePickleError, match=r"refused to load (posix|os)\.system"):
        read_trace(path)
    assert not (tmp_path / "pwned").exists()
    copyreg.add_extension("os", "system", 240)  # the extension registry goes through it too
    try:
        with pytest.raises(UnsafePickleError, match=r"os\.system"):
            read_trace(io.BytesIO(b"\x80\x02\x82\xf0."), format="pytorch_snapshot")
    finally:
        copyreg.remove_extension("os", "system", 240)


def test_garbage_is_not_a_pickle(tmp_path: Path) -> None:
    (tmp_path / "bad.pickle").write_bytes(b"\x80\x04garbage")
    with pytest.raises(MalformedTraceError, match="not a readable pickle"):
        read_trace(tmp_path / "bad.pickle")


def test_build_snapshot_takes_any_allocator_history() -> None:
    from tensorarena.trace import BlockState, SegmentState

    actions = [SnapshotAction("segment_alloc", 0x1000, 4096), SnapshotAction("alloc", 0x1000,
               100, tag="x"), SnapshotAction("free", 0x1000, 100), SnapshotAction("oom", 0, 9)]
    state = [SegmentState(0x1000, 4096, 0, True, (BlockState(0x1000, 4096, 0, False),))]
    data = build_snapshot(actions, state, device=2)
    assert [e["action"] for e in data["device_traces"][2]] == [
        "segment_alloc", "alloc", "free_requested", "free_completed", "oom"]
    assert data["device_traces"][2][1]["frames"] == [{"filename": "<tag>", "line": 0,
                                                      "name": "x"}]
    assert data["device_traces"][:2] == [[], []] and data["segments"][0]["device"] == 2


def test_a_live_pool_and_its_logged_history_make_a_snapshot(tmp_path: Path) -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz")
    from tensorarena.adaptors import Logging
    from tensorarena.memory import Pool, SameAsRequested, VirtualMemory
    from tensorarena.trace import actions_from_log, pool_segments

    upstream = Logging(VirtualMemory())
    pool = Pool(upstream, strategy="best_fit", growth=SameAsRequested(), initial_size=0)
    logged = Logging(pool)
    blocks = [logged.allocate(n) for n in (1000, 5000, 3 << 20, 777)]
    logged.deallocate(blocks[1], 5000)
    segments = pool_segments(pool)
    assert len(segments) == len(pool.arenas)
    for segment in segments:
        assert sum(b.size for b in segment.blocks) == segment.total_size
    active = sorted(b.requested for s in segments for b in s.blocks if b.allocated)
    assert active == [777, 1000, 3 << 20]
    history = actions_from_log(logged.records) + actions_from_log(upstream.records,
                                                                  segments=True)
    write_snapshot(pool, tmp_path / "empty-history.pickle")
    write_snapshot(snapshot_of(pool, history=history), tmp_path / "pool.pickle")
    with open(tmp_path / "pool.pickle", "rb") as handle:
        data = pickle.load(handle)
    actions = [e["action"] for e in data["device_traces"][0]]
    assert actions.count("segment_alloc") == 4 and actions.count("alloc") == 4
    assert actions.index("segment_alloc") < actions.index("alloc")
    viz.segsum(data)
    viz.trace_plot(data)
    assert read_trace(tmp_path / "pool.pickle").summary().live_at_end_blocks == 3
