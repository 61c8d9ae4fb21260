"""Recording real PyTorch programs, the command that records a script, the shipped traces."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tensorarena.cli.main import main
from tensorarena.errors import InvalidArgumentError
from tensorarena.trace import read_trace
from tensorarena.trace.configs import configuration, smallest_fixed_arena
from tensorarena.trace.workloads import WORKLOADS, shipped_traces

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_record_torch_sees_every_allocation_and_free() -> None:
    from tensorarena.trace import record_torch

    before = torch.empty(25)  # made outside, freed inside: the profiler does not report it
    with record_torch() as recording:
        with pytest.raises(InvalidArgumentError, match="still running"):
            _ = recording.trace
        a = torch.empty(1000)
        b = torch.empty(2000)
        del a
        del before
        c = torch.mm(torch.ones(16, 16), torch.ones(16, 16))
    trace = recording.trace
    allocations = [(e.nbytes, e.tag) for e in trace if e.op == "a"]
    assert (4000, "aten::empty") in allocations and (8000, "aten::empty") in allocations
    assert (1024, "aten::mm") in allocations and (100, "preexisting") not in allocations
    assert trace.metadata["device"] == "cpu"
    freed = {e.nbytes for e in trace if e.op == "f"}
    assert 4000 in freed and 8000 not in freed  # b is still alive
    times = [e.time_us for e in trace]
    assert times[0] == 0 and times == sorted(times)
    del b, c


def test_a_script_is_recorded_by_the_command(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "work.py"
    script.write_text("import sys, torch\nassert sys.argv[1:] == ['--n', '3']\n"
                      "x = [torch.zeros(1 << 12) for _ in range(3)]\nraise SystemExit(0)\n")
    out = tmp_path / "work.csv"
    assert main(["trace", "record", "-o", str(out), "--", sys.executable, str(script),
                 "--n", "3"]) == 0
    trace = read_trace(out)
    assert sum(e.nbytes == 1 << 14 and e.op == "a" for e in trace) == 3
    assert "recorded 3 allocations" in capsys.readouterr().err or trace.summary().allocations


def test_a_failing_script_leaves_its_trace_marked_partial_and_its_status(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "bad.py"
    script.write_text("import torch\nx = torch.zeros(1 << 12)\nraise RuntimeError('boom')\n")
    out = tmp_path / "t.csv"
    assert main(["trace", "record", "-o", str(out), "--", sys.executable, str(script)]) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err and "partial: the program raised RuntimeError" in err
    trace = read_trace(out)
    assert trace.metadata["partial"] == "the program raised RuntimeError: boom"
    assert any(e.op == "a" and e.nbytes == 1 << 14 for e in trace)  # what ran before it
    assert main(["trace", "record", "-o", str(out), "--", "ls"]) == 2
    assert "Python programs" in capsys.readouterr().err


@pytest.mark.parametrize(("ending", "status", "why"), [
    ("raise SystemExit(3)", 3, "the program exited with status 3"),
    ("raise SystemExit('bad input')", 1, "the program exited with status 1"),
    ("raise KeyboardInterrupt", 130, "interrupted (Ctrl-C)"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143, "terminated (SIGTERM)"),
    ("raise SystemExit(0)", 0, None),
])
def test_the_exit_status_is_the_scripts_and_the_trace_says_why_it_ended(
        ending: str, status: int, why: str | None, tmp_path: Path) -> None:
    script = tmp_path / "ends.py"
    script.write_text(f"import torch\nx = torch.zeros(1 << 12)\n{ending}\nprint('never')\n")
    out = tmp_path / "ends.csv"
    assert main(["trace", "record", "-o", str(out), "--", sys.executable, str(script)]) == status
    trace = read_trace(out)
    assert trace.metadata.get("partial") == why
    assert any(e.op == "a" and e.nbytes == 1 << 14 for e in trace)
    assert not list(tmp_path.glob("*.tmp*"))  # written whole (atomically), nothing left over


def test_the_output_has_a_default_beside_where_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "work.py"
    script.write_text("import torch\nx = torch.zeros(8)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "record", "--", sys.executable, str(script)]) == 0
    assert read_trace(tmp_path / "work.trace.csv").summary().allocations >= 1


def test_another_interpreter_named_runs_the_recording_or_is_refused_clearly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "work.py"
    script.write_text("import sys, torch\nx = torch.zeros(8)\nprint(sys.executable)\n")
    # a link to this interpreter under another name is another path to the same one: it runs
    # here; an interpreter without tensorarena is refused before anything runs
    shim = tmp_path / "python-other"
    shim.write_text("#!/bin/sh\nexit 1\n")
    shim.chmod(0o755)
    assert main(["trace", "record", "-o", str(tmp_path / "t.csv"), "--", str(shim),
                 str(script)]) == 2
    assert "cannot import tensorarena" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


@pytest.mark.parametrize("output", ["folder", "missing/t.csv"])
def test_an_unwritable_output_is_refused_before_the_program_runs(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # The program ran to its end, then its recording was lost when the file could not be
    # written: a long training script's worth of work for a typo in -o.
    (tmp_path / "folder").mkdir()
    marker = tmp_path / "ran"
    script = tmp_path / "work.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["trace", "record", "-o", str(tmp_path / output), "--", "python",
                 str(script)]) == 2
    assert not marker.exists()
    assert not list((tmp_path / "folder").iterdir())


def test_python_options_other_than_m_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    # python -c CODE was run as a script named '-c': a FileNotFoundError traceback, exit 1.
    assert main(["trace", "record", "-o", "t.csv", "--", "python", "-c", "pass"]) == 2
    assert "'-c' is not supported" in capsys.readouterr().err


def test_convert_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = shipped_traces()["serving"]
    assert main(["trace", "convert", str(source), "-o", str(tmp_path / "s.pickle")]) == 0
    assert main(["trace", "convert", str(tmp_path / "s.pickle"), "-o",
                 str(tmp_path / "s.log")]) == 0
    assert main(["trace", "info", str(tmp_path / "s.log")]) == 0
    assert "peak live" in capsys.readouterr().out
    assert read_trace(tmp_path / "s.log").summary().peak_live_bytes == \
        read_trace(source).summary().peak_live_bytes


def test_the_shipped_traces_are_real_workloads() -> None:
    traces = shipped_traces()
    assert set(traces) == set(WORKLOADS)
    for name, path in traces.items():
        trace = read_trace(path)
        summary = trace.summary()
        assert summary.allocations > 400 and summary.peak_live_bytes > 256 << 10, name
        assert any(e.tag.startswith("aten::") for e in trace), name
        assert path.stat().st_size < 128 << 10, name  # small files
    decoding = read_trace(traces["decoding"])
    caches = [e.nbytes for e in decoding if e.op == "a" and e.tag == "aten::cat"]
    assert max(caches) > min(caches) * 2  # the KV cache grows with every token
    training = {e.tag for e in read_trace(traces["training_step"])}
    assert any("backward" in tag.lower() or "addmm" in tag for tag in training)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_the_best_configuration_is_within_10_percent_of_peak_live(name: str) -> None:
    trace = read_trace(shipped_traces()[name])
    best = min(smallest_fixed_arena(trace, configuration(f"{s}/fixed"))[1].footprint_ratio or 9
               for s in ("first_fit", "best_fit"))
    assert best <= 1.10, (name, best)


def test_recording_a_workload_again_gives_the_same_kind_of_trace() -> None:
    pytest.importorskip("transformers")
    from tensorarena.trace.workloads import decoding, serving, training_step

    small = decoding(hidden=32, prompt=4, new_tokens=3, vocab=64)
    caches = [e.nbytes for e in small if e.op == "a" and e.tag == "aten::cat"]
    assert len(caches) >= 6 and max(caches) > min(caches)
    step = training_step(hidden=32, tokens=8, batch=2, vocab=64)
    assert step.summary().allocations > 100 and step.metadata["format"] == "torch_profiler"
    served = serving(hidden=32, requests=3, vocab=64)
    assert served.summary().live_at_end_blocks == 0 or served.summary().allocations > 50


def test_an_output_suffix_that_names_no_format_is_refused_unless_to_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = shipped_traces()["serving"]
    assert main(["trace", "convert", str(source), "-o", str(tmp_path / "out.xyz")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    assert not (tmp_path / "out.xyz").exists()
    assert main(["trace", "convert", str(source), "-o", str(tmp_path / "out.xyz"),
                 "--to", "rmm"]) == 0
    assert read_trace(tmp_path / "out.xyz").metadata["format"] == "rmm"
    assert main(["trace", "convert", str(source), "-o", str(tmp_path / "OUT.PKL")]) == 0
    assert read_trace(tmp_path / "OUT.PKL").metadata["format"] == "pytorch_snapshot"


def test_a_script_or_module_that_is_not_there_is_refused_and_nothing_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert main(["trace", "record", "-o", str(out), "--", sys.executable,
                 str(tmp_path / "nope.py")]) == 2
    assert "no script" in capsys.readouterr().err
    assert main(["trace", "record", "-o", str(out), "--", sys.executable, "-m",
                 "no_such_module_here.sub"]) == 2
    assert "no module named 'no_such_module_here.sub'" in capsys.readouterr().err
    assert not out.exists()
