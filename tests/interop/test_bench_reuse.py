"""``tensorarena bench reuse --quick --json`` runs and prints the documented shape."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tensorarena.bench import reuse
from tensorarena.interop.owner import native_owner

KEYS = {"numpy_us", "tensorarena_us", "speedup"}


def _check(document: dict[str, object]) -> None:
    assert set(document) >= KEYS
    sizes = document["sizes"]
    assert isinstance(sizes, dict) and list(sizes) == ["64KiB", "1MiB", "16MiB", "64MiB"]
    for row in sizes.values():
        assert set(row) == KEYS
        assert row["numpy_us"] > 0 and row["tensorarena_us"] > 0
        assert row["speedup"] == pytest.approx(row["numpy_us"] / row["tensorarena_us"], rel=0.01)
    assert {key: document[key] for key in KEYS} == sizes["64MiB"]
    tensors = document["torch"]
    if importlib.util.find_spec("torch") is None:
        assert tensors is None
        return
    assert isinstance(tensors, dict) and list(tensors) == ["64KiB", "1MiB", "16MiB", "64MiB"]
    for row in tensors.values():
        assert set(row) == {"torch_us", "tensorarena_us", "speedup"}
        assert row["torch_us"] > 0 and row["tensorarena_us"] > 0
        assert row["speedup"] == pytest.approx(row["torch_us"] / row["tensorarena_us"], rel=0.01)


def test_quick_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert reuse.main(["--quick", "--json"]) == 0
    _check(json.loads(capsys.readouterr().out))


def test_through_the_cli_with_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    from tensorarena.cli.main import main

    assert main(["bench", "reuse", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "np.empty" in out and "64MiB" in out and "speedup" in out
    if importlib.util.find_spec("torch") is not None:
        assert "torch.empty" in out


def test_owner_measurements_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert reuse.main(["--quick", "--json", "--owners"]) == 0
    document = json.loads(capsys.readouterr().out)
    _check(document)
    owners = document["owners"]
    assert {
        "owner_interface_us",
        "owner_ctypes_attribute_us",
        "owner_ctypes_finalize_us",
        "default_resource_pair_us",
        "empty_over_null_resource_us",
        "empty_touch_free_us",
        "np_empty_touch_free_us",
    } <= set(owners)
    assert all(value > 0 for value in owners.values())
    # The native owner is timed exactly where it is built.
    assert ("owner_native_frombuffer_us" in owners) == (native_owner is not None)
