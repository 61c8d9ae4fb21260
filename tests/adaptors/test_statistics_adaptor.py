"""Statistics adaptor: current/peak/total bytes and counts, unchanged when the upstream fails."""

from __future__ import annotations

import threading

import pytest
from _adaptor_upstreams import BufferMemory

from tensorarena.adaptors import AllocationStatistics, Statistics, ThreadSafe
from tensorarena.errors import DoubleFreeError, InvalidAlignmentError, OutOfMemoryError
from tensorarena.memory.pool import Pool
from tensorarena.memory.summary import memory_summary


def test_counts_current_peak_and_total() -> None:
    counted = Statistics(BufferMemory())
    a = counted.allocate(100)
    b = counted.allocate(300)
    counted.deallocate(a, 100)
    c = counted.allocate(50)
    stats = counted.statistics()
    assert isinstance(stats, AllocationStatistics)
    assert stats == AllocationStatistics(
        allocated_bytes=350,
        peak_allocated_bytes=400,
        total_allocated_bytes=450,
        total_freed_bytes=100,
        allocation_count=2,
        peak_allocation_count=2,
        total_allocations=3,
        total_deallocations=1,
    )
    counted.reset_peaks()
    assert counted.statistics().peak_allocated_bytes == 350
    for address, nbytes in ((b, 300), (c, 50)):
        counted.deallocate(address, nbytes)
    assert counted.statistics().allocated_bytes == 0


def test_failures_upstream_change_no_counter() -> None:
    upstream = BufferMemory()
    counted = Statistics(upstream)
    address = counted.allocate(100)
    counted.deallocate(address, 100)
    before = counted.statistics()
    with pytest.raises(DoubleFreeError):
        counted.deallocate(address, 100)
    with pytest.raises(InvalidAlignmentError):
        counted.allocate(100, alignment=6)
    upstream.fail_allocations = True
    with pytest.raises(OutOfMemoryError):
        counted.allocate(100)
    assert counted.statistics() == before


def test_counters_stay_exact_under_threads() -> None:
    counted = Statistics(ThreadSafe(Pool(BufferMemory(), initial_size="1MiB")))

    def work() -> None:
        for _ in range(500):
            counted.deallocate(counted.allocate(64), 64)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = counted.statistics()
    assert stats.total_allocations == stats.total_deallocations == 4000
    assert stats.allocated_bytes == 0 and stats.total_allocated_bytes == 4000 * 64


def test_summary_upstream_and_repr() -> None:
    upstream = BufferMemory()
    counted = Statistics(upstream)
    counted.allocate(2048)
    assert counted.upstream is upstream
    text = memory_summary(counted)
    assert "Allocated memory" in text and "2 KiB" in text and "Allocations" in text
    assert "allocated=2 KiB" in repr(counted)
    with pytest.raises(TypeError):
        Statistics(3)  # type: ignore[arg-type]
