"""``tensorarena demo`` and ``bench exec``: the report, the JSON shape, no torch at import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tensorarena.cli.main import main

KEYS = {"lower_bound", "planned_arena", "eager_peak", "naive", "eager_ms", "planned_ms",
        "max_abs_err"}


def test_importing_the_runtime_does_not_import_torch() -> None:
    code = "import sys, tensorarena.runtime; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.torch
def test_bench_exec_json_has_the_numbers_of_each_model(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    assert main(["bench", "exec", "--model", "bert", "--quick", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    bert = document["models"]["bert"]
    assert bert.keys() >= KEYS
    assert bert["max_abs_err"] == 0.0
    assert bert["lower_bound"] <= bert["planned_arena"] <= bert["naive"]
    assert bert["eager_peak"] > 0 and bert["eager_ms"] > 0 and bert["planned_ms"] > 0


@pytest.mark.torch
def test_demo_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    assert main(["demo", "--repeats", "2"]) == 0
    captured = capsys.readouterr()
    assert "gpt2 (tiny, inference)" in captured.out
    for line in ("lower bound", "planned arena", "eager peak", "no reuse", "latency",
                 "correctness"):
        assert line in captured.out
    assert "(equal); poisoned check passed" in captured.out
    assert "exporting (torch.export) and planning ..." in captured.err  # progress
