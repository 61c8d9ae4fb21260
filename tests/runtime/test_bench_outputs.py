"""``tensorarena bench outputs`` (was ``bench/outputs_latency.py``) on one tiny model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tensorarena.cli.main import main

pytestmark = pytest.mark.torch


def test_one_model_both_placements(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "outputs", "--calls", "2", "--models", "gpt2", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["calls"] == 2
    assert set(document["models"]["gpt2"]) == {"fresh", "handover"}
    assert all(ms > 0 for ms in document["models"]["gpt2"].values())


def test_an_unknown_model_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "outputs", "--models", "gpt3"]) == 2
    assert "unknown architecture(s) 'gpt3'" in capsys.readouterr().err
