"""``tensorarena bench thread-cache`` (was ``bench/thread_cache_pair.py``): every case timed."""

from __future__ import annotations

import json

import pytest

from tensorarena.bench import thread_cache
from tensorarena.cli.main import main


def test_quick_json_has_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "thread-cache", "--quick", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert list(results) == list(thread_cache.CASES)
    for row in results.values():
        assert 0 < row["best_ns"] <= row["median_ns"]


def test_the_table_names_each_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "thread-cache", "--repeats", "2", "--number", "300"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ThreadCached hit pair")
    for case in thread_cache.CASES:
        assert case in out
