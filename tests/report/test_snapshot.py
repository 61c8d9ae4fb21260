"""snapshot(): a pool's arenas and blocks (address, size, state, site), exported to PyTorch's
snapshot format by the trace package's writer."""

from __future__ import annotations

import pytest

import tensorarena as ta
from tensorarena.adaptors import Guarded, Tracking
from tensorarena.core import Arena
from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.report import snapshot
from tensorarena.report.snapshot import ACTIVE, INACTIVE


def _covers(segment: ta.report.SegmentSnapshot) -> bool:
    cursor = segment.address
    for block in segment.blocks:
        if block.address != cursor or block.size <= 0:
            return False
        cursor += block.size
    return cursor == segment.address + segment.size


def test_a_pools_arenas_and_blocks_add_up() -> None:
    pool = Pool(VirtualMemory(), initial_size="1MiB")
    a = pool.allocate(1000)
    b = pool.allocate(5000, 4096)
    c = pool.allocate("3MiB")  # a second arena
    pool.deallocate(a, 1000)
    state = snapshot(pool)
    assert len(state.segments) == 2 and all(_covers(s) for s in state.segments)
    assert state.reserved_bytes == pool.statistics().reserved_bytes.current
    assert [(blk.address, blk.size) for blk in state.blocks()] == sorted([(b, 5000),
                                                                         (c, 3 << 20)])
    assert state.active_bytes == 5000 + (3 << 20)
    assert {blk.state for s in state.segments for blk in s.blocks} == {ACTIVE, INACTIVE}
    assert "2 segment(s)" in str(state)


def test_sites_come_from_a_tracker_above_the_pool() -> None:
    pool = Pool(HostMemory())
    tracker = Tracking(pool, stack_depth=2)
    address = tracker.allocate(4096)  # TRACKED
    state = snapshot(tracker)
    (block,) = state.blocks()
    assert block.address == address and block.stack[0][2] == (
        "test_sites_come_from_a_tracker_above_the_pool")
    assert "test_snapshot.py" in block.site
    tracker.deallocate(address, 4096)


def test_a_guarded_stack_is_read_at_the_pool_without_sites() -> None:
    pool = Pool(HostMemory())
    guarded = Guarded(pool)
    address = guarded.allocate(100)
    (block,) = snapshot(guarded).blocks()
    assert block.address < address < block.address + block.size and block.stack == ()
    guarded.deallocate(address, 100)


def test_resources_without_arenas() -> None:
    host = HostMemory()
    address = host.allocate(10_000)
    state = snapshot(host)
    assert [(s.address, s.size) for s in state.segments] == [(address, 10_000)]
    host.deallocate(address, 10_000)
    arena = Arena("1MiB", base=1 << 40)
    block = arena.allocate(512)
    (segment,) = snapshot(arena).segments
    assert (segment.address, segment.size) == (1 << 40, 1 << 20) and _covers(segment)
    arena.deallocate(block)


def test_to_pytorch_writes_blocks_that_pytorchs_viewer_accepts() -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz")
    pool = Pool(HostMemory())
    blocks = [pool.allocate(n) for n in (256, 1000, 70_000)]
    data = snapshot(pool).to_pytorch()
    assert data["device_traces"] == [[]]
    assert "total_reserved" in viz.segsum(data)
    for address, nbytes in zip(blocks, (256, 1000, 70_000), strict=True):
        pool.deallocate(address, nbytes)


class _Bare:
    """A resource that keeps no record of its blocks."""

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return 4096

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        pass


def test_something_without_live_blocks_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="live_blocks"):
        snapshot(_Bare())
    with pytest.raises(InvalidArgumentError, match="allocate/deallocate"):
        snapshot(object())
