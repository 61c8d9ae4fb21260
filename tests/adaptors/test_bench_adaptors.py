"""``tensorarena bench adaptors --quick --json`` runs every stack and prints the documented JSON."""

from __future__ import annotations

import json

import pytest

from tensorarena.bench import adaptors
from tensorarena.cli.main import main


def test_quick_json_has_every_stack_against_the_bare_pool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert adaptors.main(["--quick", "--json", "--ops", "200"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert list(document["stacks"]) == list(adaptors.STACKS)
    assert document["stacks"]["pool"]["ratio"] == 1.0
    for row in document["stacks"].values():
        assert row["ns_per_pair"] > 0
        assert row["ratio"] == pytest.approx(row["ns_per_pair"] / document["stacks"]["pool"][
            "ns_per_pair"])
    assert document["operations"] == 200


def test_table_through_the_cli_and_bad_stack_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "adaptors", "--quick", "--ops", "100", "--stacks", "guarded"]) == 0
    out = capsys.readouterr().out
    assert "Pool(HostMemory()) alone" in out and "Guarded (no sites)" in out
    assert "Poisoning" not in out
    assert adaptors.main(["--stacks", "nonsense"]) == 2
