"""``tensorarena bench pool-pair`` (was ``bench/pool_pair.py``): every strategy, both pools."""

from __future__ import annotations

import json

import pytest

from tensorarena.cli.main import main
from tensorarena.core import STRATEGIES


def test_quick_json_times_every_strategy_in_both_pools(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pool-pair", "--quick", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["pair_bytes"] == 64 << 10
    assert list(document["strategies"]) == list(STRATEGIES)
    for row in document["strategies"].values():
        assert row["one_arena_us"] > 0 and row["fragmented_first_us"] > 0


def test_the_table_has_a_row_per_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pool-pair", "--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("64 KiB allocate+deallocate pair")
    assert [line.split()[0] for line in lines[2:]] == list(STRATEGIES)
