"""``tensorarena demo`` and ``bench exec``: the report, the JSON shape, no torch at import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    assert document["build"] in ("compiled", "pure")
    bert = document["models"]["bert"]
    assert bert.keys() >= KEYS
    assert bert["max_abs_err"] == 0.0
    assert bert["lower_bound"] <= bert["planned_arena"] <= bert["naive"]
    assert bert["eager_peak"] > 0 and bert["eager_ms"] > 0 and bert["planned_ms"] > 0
    assert bert["outputs"] == "handover" and bert["reordered"] is False  # inference's defaults
    assert bert["tail_bytes"] > 0  # the outputs, planned in the tail handed over


@pytest.mark.torch
def test_bench_exec_places_outputs_as_asked(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    assert main(["bench", "exec", "--model", "bert", "--quick", "--json", "--outputs", "arena",
                 "--no-reorder"]) == 0
    document = json.loads(capsys.readouterr().out)
    bert = document["models"]["bert"]
    assert document["outputs"] == bert["outputs"] == "arena" and bert["reordered"] is False
    assert bert["max_abs_err"] == 0.0
    assert bert["paths"].get("dynamic", 0) == 0  # the outputs are planned, none left to torch


@pytest.mark.torch
def test_demo_prints_the_report_and_writes_the_memory_timeline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("plotly")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--repeats", "2"]) == 0
    captured = capsys.readouterr()
    page = (tmp_path / "tensorarena-demo.html").read_text(encoding="utf-8")
    assert "Memory timeline: gpt2 (tiny, inference), one planned call" in page
    assert "arena: aten.addmm.default" in page  # the planned slots, by the op that writes them
    assert "<script src=" not in page  # self-contained: plotly inlined, nothing to fetch
    assert "wrote tensorarena-demo.html" in captured.err
    assert "gpt2 (tiny, inference)" in captured.out
    for line in ("lower bound", "planned arena", "eager peak", "no reuse", "latency",
                 "correctness"):
        assert line in captured.out
    assert "(equal); poisoned check passed" in captured.out
    assert "exporting (torch.export) and planning ..." in captured.err  # progress


def test_demo_without_plotly_names_the_extra_and_carries_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorarena.cli import demo

    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly now raises ImportError
    assert demo._html_path("page.html") is None
    assert "pip install 'tensorarena[viz]'; carrying on" in capsys.readouterr().err
    assert demo._html_path(None) is None  # --no-html: nothing asked, nothing said
    assert capsys.readouterr().err == ""
