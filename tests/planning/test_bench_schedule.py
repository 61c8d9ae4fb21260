"""``tensorarena bench schedule``: the JSON contract of issue 9 on one tiny model."""

from __future__ import annotations

import json

import pytest

from tensorarena.cli.main import main

pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.torch


def test_bench_schedule_json_reports_the_reordered_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "schedule", "--size", "tiny", "--names", "gpt2", "--time-limit", "1",
            "--json"]
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["build"] in ("compiled", "pure")
    assert document["skipped"] == {}
    assert set(document["models"]) == {"gpt2-inference", "gpt2-training"}
    for row in document["models"].values():
        # No order goes below the order bound; reorder never returns worse than Inductor's best
        # heuristic nor than the graph as traced; the plan sits at or above its lower bound.
        assert row["order_bound"] <= row["reordered_lower_bound"]
        assert row["reordered_lower_bound"] <= min(row["inductor_best"], row["lower_bound"])
        assert row["reordered_lower_bound"] <= row["reordered_height"]
        assert row["seconds"] >= 0 and row["method"]


def test_an_unknown_architecture_is_refused_before_any_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "schedule", "--size", "tiny", "--names", "gpt2,gpt3"]) == 2
    captured = capsys.readouterr()
    assert "'gpt3'" in captured.err and captured.out == ""
