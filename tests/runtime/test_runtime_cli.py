"""``tensorarena demo`` and ``bench exec``: the report, the JSON shape, no torch at import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorarena.cli.main import main


def test_importing_the_runtime_does_not_import_torch() -> None:
    code = "import sys, tensorarena.runtime; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _fake_measure(calls: list[tuple[Any, Any]]) -> Any:
    """measure_config's stand-in: records what it was asked, answers as a real run would."""
    from tensorarena.bench.exec_subprocess import ratios

    def measure(config: Any, run: Any, progress: Any) -> dict[str, Any]:
        calls.append((config, run))
        executions = {name: {"live_peak": 100 * (i + 1), "rss_peak": 2 << 20,
                             "rss_held": 1 << 20, "rss_held_dropped": 0, "ms": 2.0}
                      for i, name in enumerate(run.executions)}
        return {"config": config.as_dict(), "executions": executions,
                "ratios": ratios(executions), "skipped": {"compiled": "no compiler"},
                "max_abs_err": {"planned": 0.0}}

    return measure


@pytest.mark.torch
def test_bench_exec_json_names_the_machine_and_passes_the_options_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    import torch

    from tensorarena.bench import exec as bench_exec

    calls: list[tuple[Any, Any]] = []
    monkeypatch.setattr(bench_exec, "measure_config", _fake_measure(calls))
    assert main(["bench", "exec", "--size", "base", "--model", "bert", "--mode", "inference",
                 "--no-compile", "--outputs", "arena", "--no-reorder", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    [(config, run)] = calls
    assert config.label == "bert-2x256" and config.size == "base"
    assert run.executions == ("eager", "planned", "exported") and run.threads == 1
    assert run.repeats == 5
    assert run.options == {"outputs": "arena", "reorder": False}
    machine = document["machine"]
    assert machine["torch"] == torch.__version__ and machine["threads"] == 1
    assert machine["cores"] >= 1 and machine["cpu"]
    bert = document["models"]["bert-2x256"]
    assert bert["ratios"]["planned/eager"]["live_peak"] == 2.0
    assert document["build"] in ("compiled", "pure")


@pytest.mark.torch
def test_bench_exec_table_puts_the_ratios_beside_the_numbers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    from tensorarena.bench import exec as bench_exec

    monkeypatch.setattr(bench_exec, "measure_config", _fake_measure([]))
    assert main(["bench", "exec", "--model", "gpt2", "--training", "--quick"]) == 0
    out = capsys.readouterr().out
    header, eager, planned, compiled = out.splitlines()[1:5]
    assert header.split()[:3] == ["config", "execution", "live"] and "RSS x" in header
    assert eager.split()[:3] == ["gpt2-train", "eager", "100"]
    assert planned.split()[-4:] == ["2.00", "1.00", "1.00", "1.00"]  # live, RSS, held, ms
    assert compiled.split()[-4] == "3.00"
    assert "gpt2-train: compiled skipped (no compiler)" in out


@pytest.mark.torch
def test_demo_prints_the_report_and_writes_the_memory_timeline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("plotly")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--size", "tiny", "--repeats", "2"]) == 0
    captured = capsys.readouterr()
    page = (tmp_path / "tensorarena-demo.html").read_text(encoding="utf-8")
    assert "gpt2 (tiny, inference): eager and planned" in page  # side by side, one page
    assert "eager: live and reserved" in page and "planned: block layout" in page
    assert "arena: aten.addmm.default" in page  # the planned slots, by the op that writes them
    assert "<script src=" not in page  # self-contained: plotly inlined, nothing to fetch
    assert "wrote tensorarena-demo.html: one eager and one planned call" in captured.err
    assert "gpt2 (tiny, inference): eager and planned, each in a fresh process" in captured.out
    for line in ("live peak", "process peak", "held, dropped", "lower bound", "planned arena",
                 "no reuse", "latency", "correctness"):
        assert line in captured.out
    # eager's, planned's and their ratio, side by side
    assert re.search(r"live peak +[\d.]+ KiB +[\d.]+ KiB +x\d\.\d\d ", captured.out)
    assert "(equal); poisoned check passed" in captured.out
    assert "eager and planned, each in a fresh process (build" in captured.err  # progress


def test_demo_without_plotly_names_the_extra_and_carries_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorarena.cli import demo

    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly now raises ImportError
    assert demo._html_path("page.html") is None
    assert "pip install 'tensorarena[viz]'; carrying on" in capsys.readouterr().err
    assert demo._html_path(None) is None  # --no-html: nothing asked, nothing said
    assert capsys.readouterr().err == ""
