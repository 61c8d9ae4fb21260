"""PyTorchLike follows the documented policy of PyTorch's CUDA caching allocator."""

from __future__ import annotations

import random

import pytest

from tensorarena.errors import DoubleFreeError, InvalidAddressError, OutOfMemoryError
from tensorarena.memory import VirtualMemory
from tensorarena.trace import PyTorchLike
from tensorarena.trace.pytorch_like import round_size, segment_size

KiB, MiB = 1 << 10, 1 << 20


def _actions() -> tuple[PyTorchLike, list[tuple[str, int, int, int]]]:
    log: list[tuple[str, int, int, int]] = []
    return PyTorchLike(on_action=lambda *a: log.append(a)), log


@pytest.mark.parametrize(("nbytes", "rounded"), [(1, 512), (512, 512), (513, 1024),
                                                 (MiB + 1, MiB + 512)])
def test_requests_are_rounded_to_512_bytes(nbytes: int, rounded: int) -> None:
    assert round_size(nbytes) == rounded


@pytest.mark.parametrize(("rounded", "segment"), [(512, 2 * MiB), (MiB, 2 * MiB),
                                                  (MiB + 512, 20 * MiB), (10 * MiB - 512, 20 * MiB),
                                                  (10 * MiB, 10 * MiB), (11 * MiB, 12 * MiB)])
def test_segment_sizes(rounded: int, segment: int) -> None:
    assert segment_size(rounded) == segment


def test_small_requests_share_a_2mib_segment_and_large_ones_a_20mib_one() -> None:
    allocator, log = _actions()
    a = allocator.allocate(1000)
    b = allocator.allocate(3000)
    c = allocator.allocate(2 * MiB)
    d = allocator.allocate(3 * MiB)
    assert [x[0] for x in log].count("segment_alloc") == 2
    assert b == a + 1024  # rounded to 512s, placed one after the other
    assert d == c + 2 * MiB  # split from the same 20 MiB segment: 18 MiB remained (> 1 MiB)
    stats = allocator.statistics()
    assert stats.reserved_bytes.current == 22 * MiB
    assert stats.allocated_bytes.current == 1024 + 3072 + 5 * MiB
    assert stats.requested_bytes.current == 4000 + 5 * MiB


def test_a_large_block_is_split_only_when_more_than_1mib_remains() -> None:
    allocator = PyTorchLike()
    big = allocator.allocate(12 * MiB)  # its own 12 MiB segment
    allocator.deallocate(big, 12 * MiB)
    whole = allocator.allocate(11 * MiB)  # 1 MiB would remain: not split
    assert whole == big
    assert allocator.statistics().allocated_bytes.current == 12 * MiB
    allocator.deallocate(whole, 11 * MiB)
    part = allocator.allocate(10 * MiB)  # 2 MiB remain: split
    assert allocator.statistics().allocated_bytes.current == 10 * MiB
    assert allocator.statistics().free_bytes == 2 * MiB and part == big


def test_a_small_block_is_split_when_512_bytes_remain() -> None:
    allocator = PyTorchLike()
    first = allocator.allocate(2048)
    allocator.allocate(512)  # keeps the segment's tail apart
    allocator.deallocate(first, 2048)
    again = allocator.allocate(1536)
    assert again == first and allocator.statistics().free_extents == 2  # 512 split off


def test_best_fit_prefers_the_smallest_free_block_then_the_lowest_address() -> None:
    allocator = PyTorchLike()
    blocks = [allocator.allocate(n) for n in (4096, 512, 2048, 512, 2048, 512)]
    for index in (0, 2, 4):
        allocator.deallocate(blocks[index], (4096, 512, 2048, 512, 2048, 512)[index])
    assert allocator.allocate(1500) == blocks[2]
    assert allocator.allocate(1500) == blocks[4]
    assert allocator.allocate(1500) == blocks[0]


def test_freed_blocks_are_reused_on_their_own_stream_only() -> None:
    allocator, log = _actions()
    block = allocator.allocate(1000, stream=1)
    allocator.deallocate(block, 1000, stream=1)
    other = allocator.allocate(1000, stream=2)
    assert other != block and [x[0] for x in log].count("segment_alloc") == 2
    assert allocator.allocate(1000, stream=1) == block


def test_frees_merge_neighbours_and_empty_cache_gives_whole_segments_back() -> None:
    allocator, log = _actions()
    rng = random.Random(2)
    live = [(allocator.allocate(n), n) for n in (rng.randrange(1, 200_000) for _ in range(50))]
    rng.shuffle(live)
    for address, nbytes in live:
        allocator.deallocate(address, nbytes)
    stats = allocator.statistics()
    assert stats.free_extents == stats.segments.current  # one free block per segment
    assert stats.inactive_split_bytes == 0
    released = allocator.empty_cache()
    assert released == stats.reserved_bytes.current
    assert allocator.statistics().reserved_bytes.current == 0
    assert [x[0] for x in log].count("segment_free") == stats.segments.current


def test_segments_describe_every_byte() -> None:
    allocator = PyTorchLike()
    kept = [allocator.allocate(n) for n in (100, 5000, 3 * MiB)]
    allocator.deallocate(kept[1], 5000)
    for segment in allocator.segments():
        assert sum(b.size for b in segment.blocks) == segment.total_size
        addresses = [b.address for b in segment.blocks]
        assert addresses[0] == segment.address and addresses == sorted(addresses)


def test_bad_frees_name_themselves() -> None:
    allocator = PyTorchLike()
    block = allocator.allocate(100)
    allocator.deallocate(block, 100)
    with pytest.raises(DoubleFreeError):
        allocator.deallocate(block, 100)
    with pytest.raises(InvalidAddressError):
        allocator.deallocate(block + 512, 100)


def test_when_the_upstream_is_full_free_segments_are_released_and_the_request_retried() -> None:
    allocator = PyTorchLike(VirtualMemory(capacity=64 * MiB))
    first = allocator.allocate(40 * MiB)
    allocator.deallocate(first, 40 * MiB)
    with pytest.raises(OutOfMemoryError):  # VirtualMemory never reuses: retry cannot help
        allocator.allocate(50 * MiB)
    assert allocator.statistics().num_alloc_retries == 1
    assert allocator.statistics().reserved_bytes.current == 0
