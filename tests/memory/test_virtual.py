"""VirtualMemory: terabytes of addresses, monotonic and never reused, no byte ever touched."""

from __future__ import annotations

import dataclasses
import itertools
import random
from pathlib import Path

import pytest

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidSizeError,
    OutOfMemoryError,
)
from tensorarena.memory.pool import Pool
from tensorarena.memory.virtual import DEFAULT_VIRTUAL_BASE, VirtualMemory

TiB = 1 << 40


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_terabytes_cost_nothing() -> None:
    virtual = VirtualMemory()
    before = _rss_kib()
    addresses = [virtual.allocate(TiB) for _ in range(100)]
    assert _rss_kib() - before < 1024
    assert addresses == sorted(addresses)
    assert all(b - a >= TiB for a, b in itertools.pairwise(addresses))
    stats = virtual.statistics()
    assert stats.requested_bytes.current == 100 * TiB and stats.allocations.current == 100
    assert virtual.used == 100 * TiB
    for address in addresses:
        virtual.deallocate(address, TiB)
    assert virtual.statistics().requested_bytes.current == 0
    assert virtual.statistics().requested_bytes.peak == 100 * TiB


def test_addresses_increase_and_are_never_reused() -> None:
    virtual = VirtualMemory("1GiB")
    rng = random.Random(7)
    seen: set[int] = set()
    previous = 0
    for _ in range(500):
        nbytes = rng.randrange(1, 100_000)
        alignment = 1 << rng.randrange(0, 13)
        address = virtual.allocate(nbytes, alignment)
        assert address % alignment == 0
        assert address >= previous and address not in seen
        seen.add(address)
        previous = address + nbytes
        virtual.deallocate(address, nbytes)


def test_alignment_padding_is_counted_as_reserved() -> None:
    virtual = VirtualMemory(base=DEFAULT_VIRTUAL_BASE)
    first = virtual.allocate(1, 1)
    second = virtual.allocate(1, 4096)
    assert first == DEFAULT_VIRTUAL_BASE
    assert second == DEFAULT_VIRTUAL_BASE + 4096
    assert virtual.statistics().reserved_bytes.current == 1 + 4096
    assert virtual.used == 4097


def test_exhaustion_raises_and_changes_nothing() -> None:
    virtual = VirtualMemory("1MiB")
    keep = virtual.allocate(768 * 1024)
    before = (virtual.statistics(), virtual.used)
    with pytest.raises(OutOfMemoryError) as error:
        virtual.allocate(512 * 1024)
    assert error.value.free == 256 * 1024 and error.value.capacity == 1 << 20
    stats, used = before
    assert (virtual.statistics(), virtual.used) == (dataclasses.replace(stats, num_ooms=1), used)
    # Freed address space is not reused, so even after the free the request cannot succeed.
    virtual.deallocate(keep, 768 * 1024)
    with pytest.raises(OutOfMemoryError):
        virtual.allocate(512 * 1024)
    assert virtual.allocate(256 * 1024) == DEFAULT_VIRTUAL_BASE + 768 * 1024


def test_bad_construction() -> None:
    with pytest.raises(InvalidSizeError):
        VirtualMemory(0)
    with pytest.raises(InvalidSizeError):
        VirtualMemory("huge")
    for base in (0, -4096, 1.5, None):
        with pytest.raises(InvalidAddressError):
            VirtualMemory(base=base)  # type: ignore[arg-type]


def test_bookkeeping_errors() -> None:
    virtual = VirtualMemory()
    address = virtual.allocate(100)
    virtual.deallocate(address, 100)
    with pytest.raises(DoubleFreeError):
        virtual.deallocate(address, 100)
    with pytest.raises(InvalidAddressError):
        virtual.deallocate(address + 1, 100)


def test_a_pool_over_virtual_memory_simulates_a_huge_footprint() -> None:
    virtual = VirtualMemory()
    pool = Pool(virtual, initial_size="1TiB")
    blocks = [pool.allocate(100 << 30) for _ in range(30)]  # 3 TiB of "tensors"
    assert len(virtual.live_blocks()) >= 2  # the pool had to grow beyond its first arena
    assert virtual.statistics().requested_bytes.current >= 3000 << 30
    for address in blocks:
        pool.deallocate(address, 100 << 30)
    pool.trim()
    assert virtual.live_blocks() == {}
    assert "VirtualMemory(" in repr(virtual)
