"""``tensorarena replay``: the JSON contract, exit statuses, baselines, the recommendation."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from _traces import random_trace

from tensorarena.cli.main import main
from tensorarena.core import STRATEGIES
from tensorarena.trace import write_csv, write_rmm, write_snapshot


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "workload.csv"
    write_csv(random_trace(400, seed=8, max_bytes=1 << 20), path)
    return path


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["replay", *argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object
    return json.loads(out)  # type: ignore[no-any-return]


def test_the_json_contract(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, str(trace_file))
    summary = random_trace(400, seed=8, max_bytes=1 << 20).summary()
    assert data["trace"]["peak_live"] == summary.peak_live_bytes
    assert data["trace"]["events"] == summary.events and data["trace"]["format"] == "csv"
    result = data["results"]["best_fit"]
    assert isinstance(result["peak_reserved"], int) and result["peak_reserved"] >= summary.\
        peak_live_bytes
    assert isinstance(result["footprint_ratio"], float) and result["footprint_ratio"] >= 1.0
    assert isinstance(result["fragmentation"], float) and isinstance(result["ns_per_op"], float)
    assert result["failures"] == 0


def test_all_runs_every_strategy_and_every_baseline(trace_file: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, str(trace_file), "--strategy", "all", "--growth", "doubling")
    ran = set(data["results"]) | set(data["skipped"])
    assert ran == {*STRATEGIES, "pytorch_like", "glibc", "jemalloc", "mimalloc"}
    assert "pytorch_like" in data["results"]
    for reason in data["skipped"].values():
        assert "install" in reason or "Linux" in reason


def test_every_format_replays_alike(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = random_trace(300, seed=2)
    peaks = set()
    for name, writer in (("a.csv", write_csv), ("b.log", write_rmm),
                         ("c.pickle", write_snapshot)):
        writer(trace, tmp_path / name)
        peaks.add(_json(capsys, str(tmp_path / name))["trace"]["peak_live"])
    assert peaks == {trace.summary().peak_live_bytes}


def test_a_table_without_json(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(trace_file), "--strategy", "best_fit,tlsf"]) == 0
    out = capsys.readouterr().out
    assert "peak live" in out and "best_fit" in out and "tlsf" in out and "footprint" in out


def test_recommend(trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, str(trace_file), "--recommend")
    advice = data["recommendation"]
    assert advice["recommended"]["failures"] == 0
    assert advice["recommended"]["footprint_ratio"] <= min(
        r["footprint_ratio"] for r in advice["ranking"]
        if not r["failures"] and not r["baseline"]) * 1.02 + 1e-9
    assert main(["replay", str(trace_file), "--recommend", "--quiet"]) == 0
    assert "use: " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("op,id,size\na,0,10\nf,1,10\n", "line 3"),
        ("op,id,size\na,0,x\n", "line 2, column 'size'"),
        ("hello\n", "unknown trace format"),
        ("", "empty"),
    ],
)
def test_a_malformed_trace_exits_2_with_the_line(tmp_path: Path, text: str, words: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.csv").write_text(text)
    assert main(["replay", str(tmp_path / "bad.csv"), "--json"]) == 2
    captured = capsys.readouterr()
    assert words in captured.err and captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1


def test_bad_options_and_missing_files_exit_2(trace_file: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(trace_file), "--strategy", "worst_fit"]) == 2
    assert "unknown configuration" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err


class _Exploit:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch pwned",))


def test_a_crafted_pickle_is_refused_by_the_command_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.pickle").write_bytes(pickle.dumps({"device_traces": [[_Exploit()]]}))
    assert main(["replay", "evil.pickle"]) == 2
    assert "refused to load" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()


def test_a_large_file_is_streamed_and_fixed_finds_its_smallest_arena(
        trace_file: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from tensorarena.cli import replay as command

    in_memory = _json(capsys, str(trace_file), "--strategy", "best_fit,first_fit")
    monkeypatch.setattr(command, "_STREAM_ABOVE", 0)
    streamed = _json(capsys, str(trace_file), "--strategy", "best_fit,first_fit")
    assert streamed["trace"] == in_memory["trace"]
    for name in ("best_fit", "first_fit"):
        assert streamed["results"][name]["peak_reserved"] == \
            in_memory["results"][name]["peak_reserved"]
    fixed = _json(capsys, str(trace_file), "--growth", "fixed")["results"]["best_fit"]
    assert fixed["failures"] == 0 and fixed["upstream_allocs"] == 1
    assert fixed["footprint_ratio"] <= in_memory["results"]["best_fit"]["footprint_ratio"]


def test_every_column_of_the_table_is_explained_once(
        trace_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorarena.cli.replay import LEGEND

    assert main(["replay", str(trace_file), "--strategy", "best_fit,tlsf,first_fit"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("configuration"))
    columns = [c.strip() for c in header.split("  ") if c.strip()][1:]
    explained = [line.split(":")[0] for line in LEGEND]
    assert explained == columns  # each column, in order, none left out
    for line in LEGEND:
        assert out.count(line) == 1  # once, not per configuration


def test_one_allocator_of_a_trace_naming_several_is_replayed_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorarena.trace import Event

    path = tmp_path / "both.csv"
    write_csv([Event("a", 0, 4096, 0, 0, "", "torch"),
               Event("a", 1, 1000, 0, 1, "", "tensorarena/default"),
               Event("f", 0, 4096, 0, 2, "", "torch"),
               Event("a", 2, 8192, 0, 3, "", "torch")], path)
    assert _json(capsys, str(path), "--allocator", "torch")["trace"]["peak_live"] == 8192
    assert _json(capsys, str(path), "--allocator", "tensorarena/default")["trace"][
        "allocations"] == 1
    assert main(["replay", str(path), "--allocator", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "no event of allocator 'cuda'" in err and "'torch'" in err
