"""``tensorarena bench torch-use`` runs and reports every configuration (bench/torch_use.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tensorarena.cli.main import main

pytestmark = pytest.mark.torch


def test_the_bench_prints_every_configuration_and_size(shim: Any, capsys: Any) -> None:
    assert main(["bench", "torch-use", "--json", "--iterations", "20", "--batches", "1"]) == 0
    document = json.loads(capsys.readouterr().out)
    times = document["ns_per_tensor"]
    assert set(times) == {"torch", "route-slot", "route-default", "route-pool", "learned-native",
                          "learned-python", "native-pool", "native-pool-call"}
    assert all(set(sizes) == {"64", "4096", "1048576"} for sizes in times.values())
    assert all(value > 0 for sizes in times.values() for value in sizes.values())
