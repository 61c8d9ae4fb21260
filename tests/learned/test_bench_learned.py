"""``tensorarena bench learned`` (was ``bench/learned_replay.py``): every trace, three configs."""

from __future__ import annotations

import json

import pytest

from tensorarena.bench.learned import CONFIGS
from tensorarena.cli.main import main


def test_json_has_every_shipped_trace_on_every_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "learned", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    replays = document["replays"]
    assert {"training_step", "training_step x8"} <= set(replays)
    for row in replays.values():
        for config in CONFIGS:
            assert row[config]["failures"] == 0
            assert row[config]["footprint_ratio"] >= 1.0
    assert "training_step x8 with markers" in document
