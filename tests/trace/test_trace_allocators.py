"""A recording sees torch's allocator and tensorarena's pools, says which served each event and
where the program made it (its Python site); traces without those columns read as before."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.cli.main import main
from tensorarena.trace import Event, read_trace, write_trace
from tensorarena.trace.pool_recorder import PoolRecording

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

HERE = Path(__file__).name


def _line_of(text: str) -> int:
    """The line of this file that contains ``text`` (the sites name lines)."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "_line_of" not in line)


def test_one_recording_shows_torch_the_default_resource_and_a_pool_told_apart() -> None:
    from tensorarena.trace import record_torch

    with record_torch() as recording:
        a = torch.empty(1 << 18)  # torch-made
        b = ta.empty((1 << 18,), dtype=np.float32)  # default-made
        with ta.Pool(ta.HostMemory(), initial_size=0) as pool:
            x = pool.allocate(3000)  # pool-made
            pool.deallocate(x, 3000)
        del a, b
    trace = recording.trace
    made = {(e.allocator, e.nbytes): e for e in trace if e.op == "a"}
    assert ("torch", 1 << 20) in made
    assert ("tensorarena/default", 1 << 20) in made
    # numbered in the order pools were first seen (pools other tests left alive come first)
    mine = next(e.allocator for e in trace if e.nbytes == 3000)
    assert mine.startswith("tensorarena/pool") and (mine, 3000) in made
    # each allocation names this file's line that made it, innermost first
    assert made["torch", 1 << 20].site.startswith(f"{HERE}:{_line_of('# torch-made')} in ")
    assert made["tensorarena/default", 1 << 20].site.startswith(
        f"{HERE}:{_line_of('# default-made')} in ")
    assert made[mine, 3000].site.startswith(f"{HERE}:{_line_of('# pool-made')}")
    freed = {(e.allocator, e.nbytes) for e in trace if e.op == "f"}
    assert {("torch", 1 << 20), (mine, 3000)} <= freed
    times = [e.time_us for e in trace]
    assert times == sorted(times)
    # merged by one clock: the pool's allocation lies between torch's and the pool's free
    order = [(e.op, e.allocator, e.nbytes) for e in trace]
    assert order.index(("a", "torch", 1 << 20)) < order.index(("a", mine, 3000)) \
        < order.index(("f", mine, 3000))


def test_pools_and_stacks_can_be_left_out() -> None:
    from tensorarena.trace import record_torch

    with record_torch(pools=False, stack_depth=0) as recording:
        a = torch.empty(1 << 10)
        b = ta.empty((1 << 10,), dtype=np.float32)
    del a, b
    trace = recording.trace
    assert {e.allocator for e in trace} == {"torch"}
    assert all(e.site == "" for e in trace)


def test_the_stack_depth_bounds_the_frames_kept() -> None:
    def inner() -> int:
        return pool.allocate(64)

    def middle() -> int:
        return inner()

    pool = ta.Pool(ta.HostMemory(), initial_size=0)
    with PoolRecording(stack_depth=2) as recording:
        addresses = [middle() for _ in range(3)]
    for address in addresses:
        pool.deallocate(address, 64)  # after the recording: not seen
    reports = [r for r in recording.reports() if r[4] == recording.label_of(pool)]
    assert len(reports) == 3
    frames = reports[0][5].split("; ")
    assert len(frames) == 2 and frames[0].endswith("in inner") and frames[1].endswith("in middle")
    assert reports[0][5] is reports[2][5]  # one string per distinct site (interned)


def test_a_pool_over_address_space_is_bookkeeping_and_not_recorded() -> None:
    with PoolRecording() as recording:
        virtual = ta.Pool(ta.VirtualMemory(), initial_size=0)
        virtual.deallocate(virtual.allocate(4096), 4096)
        real = ta.Pool(ta.HostMemory(), initial_size=0)
    assert recording.label_of(virtual) is None and recording.label_of(real) is not None


def test_a_pool_already_recorded_by_its_history_is_seen_by_both() -> None:
    from tensorarena.report import record_memory_history

    pool = ta.Pool(ta.HostMemory(), initial_size=0)
    history = record_memory_history(resource=pool, stacks=None)
    try:
        with PoolRecording(stack_depth=0) as recording:
            pool.deallocate(pool.allocate(256), 256)
        pool.deallocate(pool.allocate(128), 128)  # after stop: only the history sees it
    finally:
        record_memory_history(False, resource=pool)
    label = recording.label_of(pool)
    assert label is not None and label.startswith("tensorarena/pool")
    assert [r[2] for r in recording.reports() if r[4] == label] == [256, -256]
    assert history is not None
    assert [a.nbytes for a, _ in history.entries() if a.action == "alloc"] == [256, 128]


def test_a_trace_with_allocators_and_sites_round_trips_and_an_old_one_still_reads(
        tmp_path: Path) -> None:
    events = [Event("a", 0, 64, 0, 1, "aten::empty", "torch", "m.py:3 in f; m.py:9 in <module>"),
              Event("a", 1, 32, 0, 2, "", "tensorarena/default", "m.py:4 in f"),
              Event("f", 0, 64, 0, 3, "", "torch", "")]
    write_trace(events, tmp_path / "new.csv")
    text = (tmp_path / "new.csv").read_text()
    assert text.startswith("# tensorarena trace, version 2\n")
    assert list(read_trace(tmp_path / "new.csv")) == events
    # without the new columns it is written as version 1, which older readers take
    old = [Event("a", 0, 64), Event("f", 0, 64)]
    write_trace(old, tmp_path / "old.csv")
    assert (tmp_path / "old.csv").read_text().startswith("# tensorarena trace, version 1\n")
    (tmp_path / "v1.csv").write_text("# tensorarena trace, version 1\nop,id,size,stream,time_us,"
                                     "tag\na,0,4096,0,12,aten::empty\nf,0,,0,20,\n")
    assert [(e.allocator, e.site) for e in read_trace(tmp_path / "v1.csv")] == [("", "")] * 2


def test_a_wrapper_interpreter_runs_the_recording_once(tmp_path: Path) -> None:
    # A wrapper named after -- (pyenv's shim) is never sys.executable by its real path: the
    # recording it started named it again and delegated to itself forever.
    count = tmp_path / "count"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\necho x >> {count}\n"
                       f"[ $(wc -l < {count}) -gt 3 ] && exit 99\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    script = tmp_path / "work.py"
    script.write_text("import torch\nx = torch.zeros(8)\n")
    out = tmp_path / "t.csv"
    assert main(["trace", "record", "-o", str(out), "--", str(wrapper), str(script)]) == 0
    assert len(count.read_text().splitlines()) == 2  # the import check, the recording
    assert read_trace(out).summary().allocations >= 1


def test_sites_travel_through_a_pytorch_snapshot_as_its_frames(tmp_path: Path) -> None:
    import pickle

    events = [Event("a", 0, 512, 0, 1, "aten::empty", "", "m.py:3 in f; m.py:9 in <module>"),
              Event("a", 1, 256, 0, 2, "", "", ""), Event("f", 0, 512, 0, 3)]
    write_trace(events, tmp_path / "s.pickle", format="pytorch_snapshot")
    data = pickle.loads((tmp_path / "s.pickle").read_bytes())
    alloc = next(e for e in data["device_traces"][0] if e["action"] == "alloc")
    assert alloc["frames"] == [{"filename": "<tag>", "line": 0, "name": "aten::empty"},
                               {"filename": "m.py", "line": 3, "name": "f"},
                               {"filename": "m.py", "line": 9, "name": "<module>"}]
    back = [(e.tag, e.site) for e in read_trace(tmp_path / "s.pickle") if e.op == "a"]
    assert back == [("aten::empty", "m.py:3 in f; m.py:9 in <module>"), ("", "")]


def test_trace_info_counts_the_allocations_of_each_allocator(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    path = tmp_path / "both.csv"
    write_trace([Event("a", 0, 64, 0, 0, "", "torch"), Event("a", 1, 8, 0, 1, "", "torch"),
                 Event("a", 2, 32, 0, 2, "", "tensorarena/default")], path)
    assert main(["trace", "info", str(path)]) == 0
    assert "3 allocations (2 torch, 1 tensorarena/default)" in capsys.readouterr().out
    assert main(["trace", "info", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["allocators"] == {"torch": 2,
                                                                 "tensorarena/default": 1}


def test_a_profiler_that_cannot_start_raises_its_own_error_and_leaves_no_observer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorarena.trace import record_torch

    class Broken:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> None:
            raise RuntimeError("profiler busy")

        def __exit__(self, *exc: object) -> None:
            pass

    pool = ta.Pool(ta.HostMemory(), initial_size=0)
    monkeypatch.setattr(torch.profiler, "profile", Broken)
    with pytest.raises(RuntimeError, match="profiler busy"), record_torch():
        pass  # was a NameError ('profile' never bound) hiding the cause
    assert pool._observer is None  # nothing left attached


def test_the_command_records_a_script_using_both_allocators(tmp_path: Path) -> None:
    script = tmp_path / "both.py"
    script.write_text("import numpy as np, torch\nimport tensorarena as ta\n"
                      "a = torch.empty(1 << 16)\nb = ta.empty((1 << 16,), dtype=np.float32)\n")
    out = tmp_path / "both.csv"
    assert main(["trace", "record", "-o", str(out), "--", sys.executable, str(script)]) == 0
    made = {(e.allocator, e.site.split(";")[0]) for e in read_trace(out)
            if e.op == "a" and e.nbytes == 1 << 18}
    assert made == {("torch", "both.py:3 in <module>"),
                    ("tensorarena/default", "both.py:4 in <module>")}


def test_torchs_reports_of_blocks_a_pool_served_are_dropped_once_each() -> None:
    from tensorarena.trace.torch_recorder import without_routed

    pool = "tensorarena/pool1"
    pooled = [(1, 4096, 64, "", pool, ""), (3, 4096, -64, "", pool, "")]
    torch_side = [(2, 4096, 64, "aten::empty", "torch", ""), (4, 4096, -64, "", "torch", ""),
                  (5, 4096, 64, "aten::empty", "torch", ""),  # glibc's, later, same address
                  (6, 8192, 64, "aten::empty", "torch", "")]
    kept = without_routed(torch_side, pooled)
    assert [report[0] for report in kept] == [5, 6]
