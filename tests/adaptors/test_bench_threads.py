"""``tensorarena bench threads --quick --json`` runs and prints the documented JSON shape."""

from __future__ import annotations

import json

import pytest

from tensorarena.bench import threads


def test_quick_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert threads.main(["--quick", "--json", "--threads", "1,2,4,8", "--ops", "200"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["threads"]) == {"1", "2", "4", "8"}
    for row in document["threads"].values():
        assert row["thread_safe_ops"] > 0 and row["thread_cached_ops"] > 0
        assert 0.0 <= row["thread_cached_hit_rate"] <= 1.0
        assert row["speedup"] == pytest.approx(row["thread_cached_ops"] / row["thread_safe_ops"])
    assert document["operations_per_thread"] == 200
    assert document["upstream"] in ("HostMemory", "VirtualMemory")


def test_table_output_and_bad_thread_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert threads.main(["--quick", "--threads", "2", "--ops", "100", "--strategy", "tlsf"]) == 0
    out = capsys.readouterr().out
    assert "ThreadSafe" in out and "ThreadCached" in out and "tlsf" in out
    assert threads.main(["--threads", "two"]) == 2
    assert threads.main(["--threads", "0"]) == 2
