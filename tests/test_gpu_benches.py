"""The GPU benchmarks and the device check's summary, on any machine: without a GPU each script
says it skipped and exits 0; the replay's event sequence and the summary are plain logic."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from tensorarena.planning import Buffer, Problem

BENCH = Path(__file__).parent.parent / "bench"
SCRIPTS = ["gpu_alloc", "gpu_transfer", "gpu_managed", "gpu_replay"]


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.parametrize("name", SCRIPTS)
def test_without_a_gpu_each_benchmark_says_it_skipped(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if _cuda():
        pytest.skip("a GPU is here: scripts/gpu_check.sh runs the benchmarks for real")
    module = importlib.import_module(name)
    assert module.main(["--json"]) == 0
    assert capsys.readouterr().out.startswith("skipped: ")


def test_the_replay_frees_before_it_allocates_at_each_step() -> None:
    replay = importlib.import_module("gpu_replay")
    problem = Problem([Buffer("a", 0, 2, 100), Buffer("b", 2, 4, 50), Buffer("c", 1, 3, 10),
                       Buffer("empty", 0, 1, 0)])
    assert replay.events_of(problem) == [
        (True, 0, 100), (True, 2, 10), (False, 0, 100), (True, 1, 50), (False, 2, 10),
        (False, 1, 50),
    ]


def test_the_summary_reads_what_the_runs_wrote_and_names_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = importlib.import_module("gpu_summary")
    (tmp_path / "pytest.txt").write_text("..\n10 passed, 1 skipped in 3.2s\n")
    record = {"machine": {}, "sizes": {"4096": {"ta_pool": 1.5, "torch_empty": 3.25}}}
    (tmp_path / "gpu_alloc.json").write_text("2 MiB done\n" + json.dumps(record) + "\n")
    (tmp_path / "gpu_replay.json").write_text("skipped: no CUDA device\n")
    assert summary.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "10 passed, 1 skipped" in out and "ta_pool=1.50  torch_empty=3.25" in out
    assert "no result (gpu_transfer.json)" in out and "skipped: no CUDA device" in out
    assert sys.modules["gpu_summary"] is summary


def test_the_summary_prints_each_steps_own_counts_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It printed the last pytest line of pytest.txt, which was the executor step's, as the
    # count of every test step.
    summary = importlib.import_module("gpu_summary")
    (tmp_path / "env.txt").write_text(
        "Wed Dec  2\nstep: build  compiled (build_ext: 0)  (40 s)\n"
        "step: tests  120 passed, 3 skipped  (exit 0, 50 s)\n"
        "step: planned executor on the GPU  1 failed, 4 passed  (exit 1, 20 s)\n"
    )
    (tmp_path / "pytest.txt").write_text("120 passed, 3 skipped in 3s\n1 failed, 4 passed in 2s\n")
    assert summary.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:4] == [
        "step: build  compiled (build_ext: 0)  (40 s)",
        "step: tests  120 passed, 3 skipped  (exit 0, 50 s)",
        "step: planned executor on the GPU  1 failed, 4 passed  (exit 1, 20 s)",
    ]
    assert not any(line.startswith("gpu tests") for line in lines)
