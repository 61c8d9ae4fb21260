"""Workspace: the block planned programs share, checked when it is made."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError, InvalidResourceError  # noqa: E402
from tensorarena.runtime import Workspace  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_workspace_refuses_a_wrong_device_or_resource_when_made_not_at_first_use() -> None:
    with pytest.raises(InvalidArgumentError, match="'cpu' or 'cuda:N', not 'gpu'"):
        Workspace(device="gpu")
    with pytest.raises(InvalidResourceError, match="not str"):
        Workspace("256MiB")  # type: ignore[arg-type]


def test_a_workspace_reserves_and_grows_its_block() -> None:
    workspace = Workspace()
    assert workspace.reserve(100).numel() == 100 and workspace.generation == 1
    assert workspace.reserve(50).numel() == 100 and workspace.generation == 1
    assert workspace.reserve(200).numel() == 200 and workspace.generation == 2
