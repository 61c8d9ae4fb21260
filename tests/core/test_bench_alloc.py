"""``bench alloc --quick --json`` runs and prints one JSON object of the agreed shape."""

from __future__ import annotations

import json

import pytest

from tensorarena.bench import alloc
from tensorarena.core import STRATEGIES


def test_quick_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert alloc.main(["--quick", "--json", "--ops", "1500", "--repeats", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"build", "strategies", "python_call_ns", "libc_pair_ns"}
    assert data["build"] in ("compiled", "pure")
    assert list(data["strategies"]) == list(STRATEGIES)
    for name, result in data["strategies"].items():
        assert set(result) == {"ns_per_pair", "footprint_ratio", "fragmentation"}, name
        assert result["ns_per_pair"] > 0
        assert result["footprint_ratio"] >= 1.0  # nothing packs tighter than the live bytes
        assert 0.0 <= result["fragmentation"] < 1.0
    assert data["python_call_ns"] > 0
    assert data["libc_pair_ns"] is None or data["libc_pair_ns"] > 0


def test_table_and_strategy_selection(capsys: pytest.CaptureFixture[str]) -> None:
    assert alloc.main(["--quick", "--ops", "500", "--repeats", "1", "--strategies", "buddy"]) == 0
    out = capsys.readouterr().out
    assert "buddy" in out and "best_fit" not in out and "libc" in out
    assert alloc.main(["--quick", "--strategies", "worst_fit"]) == 2


def test_workload_is_seeded_and_balanced() -> None:
    first = alloc.make_workload(2000, seed=3)
    assert first == alloc.make_workload(2000, seed=3)
    assert first != alloc.make_workload(2000, seed=4)
    sizes = [n for _, n in (*first.fill, *first.steady) if n]
    assert min(sizes) >= alloc.MIN_SIZE and max(sizes) <= alloc.MAX_SIZE
    assert sorted(sizes)[len(sizes) // 2] < 1 << 20  # skewed toward small
    live = len(first.fill) + sum(1 if n else -1 for _, n in first.steady)
    assert 300 < live < 700


def test_table_and_help_explain_the_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert alloc.main(["--quick", "--ops", "300", "--repeats", "1", "--strategies", "buddy"]) == 0
    assert "footprint:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        alloc.main(["--help"])
    assert "columns: ns/pair:" in capsys.readouterr().out
