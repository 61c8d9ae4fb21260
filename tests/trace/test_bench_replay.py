"""``tensorarena bench replay --quick --json`` runs and prints the documented shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensorarena.bench import replay as bench
from tensorarena.trace import iter_events, read_trace

pytest.importorskip("torch")  # not needed to replay, but the shipped traces' test set-up


def test_quick_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["configurations"]) == {"training_step", "decoding", "serving"}
    for entry in document["configurations"].values():
        assert entry["peak_live"] > 0 and "best_fit" in entry["results"]
        assert entry["results"]["best_fit"]["footprint_ratio"] >= 1.0
    for row in document["best"].values():
        assert row["meets_target"] and row["footprint_ratio"] <= bench.FOOTPRINT_TARGET
    speed = document["speed"]
    assert speed["best_fit_events_per_second"]["synthetic_steady"] > 0
    for row in speed["stream"].values():
        assert row["pool"]["events"] == row["virtual"]["events"] > 0


def test_the_synthetic_trace_keeps_its_live_set(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    bench.write_synthetic(path, 5001, live=50)
    trace = read_trace(path)
    assert len(trace) == 5001 and trace.summary().peak_live_blocks == 50
    assert sum(1 for _ in iter_events(path)) == 5001
