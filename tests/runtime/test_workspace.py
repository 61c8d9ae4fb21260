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


def test_growing_replaces_the_block_instead_of_adding_one() -> None:
    from tensorarena.memory import HostMemory, Pool, Segments

    mib = 1024 * 1024
    pool = Pool(HostMemory(), growth=Segments(), initial_size=0)
    workspace = Workspace(pool)
    assert workspace.reserve(3 * mib).numel() == 4 * mib  # whole 2 MiB granules
    assert pool.statistics().reserved_bytes.current == 4 * mib  # an exact fit
    assert workspace.reserve(4 * mib).numel() == 4 * mib and workspace.generation == 1
    grown = workspace.reserve(4 * mib + 1)
    assert grown.numel() == 6 * mib
    grown[-1] = 7  # the new block is whole
    # the old block went back before the new one was taken, and its arena, empty then, went
    # back too, not kept beside the new one
    assert pool.statistics().reserved_bytes.peak == 6 * mib
    assert pool.statistics().reserved_bytes.current == 6 * mib
    assert workspace.generation == 2 and pool.statistics().allocations.current == 1
    assert workspace.reserve(mib - 1).numel() == 6 * mib  # never shrinks


def test_a_failed_growth_leaves_the_workspace_empty_and_the_old_block_to_its_holders() -> None:
    from tensorarena.errors import OutOfMemoryError
    from tensorarena.memory import HostMemory, Pool

    pool = Pool(HostMemory(), initial_size=1024 * 1024, maximum_size=1024 * 1024)
    workspace = Workspace(pool)
    block = workspace.reserve(1000)
    block[:] = 3
    with pytest.raises(OutOfMemoryError):
        workspace.reserve(2 * 1024 * 1024)
    assert workspace.nbytes == 0 and workspace.generation == 2  # code over the old block is stale
    assert int(block.sum()) == 3000  # a tensor over the old block keeps it
    assert workspace.reserve(1000).numel() == 1000 and workspace.generation == 3
