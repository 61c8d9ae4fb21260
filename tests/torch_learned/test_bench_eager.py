"""``tensorarena bench eager``'s configurations run and report what the table reads
(bench/eager.py); the whole run, each configuration in its own process, is the bench's."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("transformers")

from tensorarena.bench.eager import worker
from tensorarena.cli.main import main

pytestmark = pytest.mark.torch


def _result(capsys: Any, *argv: str) -> dict[str, Any]:
    worker(list(argv))
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_learned_and_the_interleaved_timing_agree_with_torch_step_by_step(
        shim: Any, capsys: Any) -> None:
    learned = _result(capsys, "gpt2", "learned", "5")
    assert learned["served"] > 0 and learned["steady_reserved"] >= learned["steady_live"] > 0
    assert learned["peak_reserved"] >= learned["steady_reserved"]
    timing = _result(capsys, "gpt2", "timing", "5")
    assert timing["ms_default"] > 0 and timing["ms_learned"] > 0
    assert timing["ms_learned_python"] > 0
    assert learned["fingerprints"] == timing["fingerprints"] == timing["fingerprints_default"]
    assert timing["fingerprints_python"] == timing["fingerprints"]
    assert len(set(learned["fingerprints"])) == 5  # the loop trains: every step differs


def test_too_few_steps_for_a_steady_window_is_refused(shim: Any, capsys: Any) -> None:
    assert main(["bench", "eager", "--steps", "4"]) == 2
    assert "5 at least" in capsys.readouterr().out
