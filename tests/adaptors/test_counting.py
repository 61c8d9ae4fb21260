"""Counting adaptor: requested bytes and allocations (current/peak/total), unchanged on failure."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from _upstreams import BufferMemory
from tensorarena import Count, memory_stats, memory_summary
from tensorarena.adaptors import Counting, ThreadSafe, TrafficStatistics
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAlignmentError,
    InvalidResourceError,
    OutOfMemoryError,
)
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool


def test_counts_current_peak_and_total() -> None:
    counted = Counting(BufferMemory())
    a = counted.allocate(100)
    b = counted.allocate(300)
    counted.deallocate(a, 100)
    c = counted.allocate(50)
    stats = counted.statistics()
    assert stats == TrafficStatistics(
        requested_bytes=Count(current=350, peak=400, total=450),
        allocations=Count(current=2, peak=2, total=3),
    )
    assert stats.requested_bytes.freed == 100 and stats.allocations.freed == 1
    counted.reset_peak_stats()
    assert counted.statistics().requested_bytes.peak == 350
    for address, nbytes in ((b, 300), (c, 50)):
        counted.deallocate(address, nbytes)
    assert counted.statistics().requested_bytes.current == 0


def test_failures_upstream_change_no_counter_but_ooms_are_counted() -> None:
    upstream = BufferMemory()
    counted = Counting(upstream)
    address = counted.allocate(100)
    counted.deallocate(address, 100)
    before = counted.statistics()
    with pytest.raises(DoubleFreeError):
        counted.deallocate(address, 100)
    with pytest.raises(InvalidAlignmentError):
        counted.allocate(100, alignment=6)
    assert counted.statistics() == before
    upstream.fail_allocations = True
    with pytest.raises(OutOfMemoryError):
        counted.allocate(100)
    after = counted.statistics()
    assert after.num_ooms == before.num_ooms + 1
    assert after.requested_bytes == before.requested_bytes
    assert after.allocations == before.allocations


def test_sizes_are_normalised_before_anything_is_counted_or_mapped() -> None:
    """A size string used to be mapped by the upstream and then crash the counter (block lost)."""
    host = HostMemory()
    counted = Counting(host)
    address = counted.allocate("4KiB")
    assert counted.statistics().requested_bytes.current == 4096
    assert host.live_blocks() == {address: 4096}
    counted.deallocate(address, np.int64(4096))
    assert host.live_blocks() == {} and counted.statistics().requested_bytes.current == 0
    assert type(counted.statistics().requested_bytes.total) is int


def test_counters_stay_exact_under_threads() -> None:
    counted = Counting(ThreadSafe(Pool(BufferMemory(), initial_size="1MiB")))

    def work() -> None:
        for _ in range(500):
            counted.deallocate(counted.allocate(64), 64)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = counted.statistics()
    assert stats.allocations == Count(current=0, peak=stats.allocations.peak, total=4000)
    assert 1 <= stats.allocations.peak <= 8
    assert stats.requested_bytes.current == 0 and stats.requested_bytes.total == 4000 * 64


def test_summary_descends_to_the_pool_and_shows_the_adaptor() -> None:
    pool = Pool(BufferMemory(), initial_size="1MiB")
    counted = Counting(pool)
    counted.allocate(2048)
    assert counted.upstream is pool
    text = memory_summary(counted)
    assert "Requested bytes" in text and "Reserved bytes" in text and "1 MiB" in text
    assert "Counting: num ooms 0" in text
    flat = memory_stats(counted)
    assert flat["requested_bytes.all.current"] == 2048  # the pool's, PyTorch's keys
    assert flat["counting.requested_bytes.all.current"] == 2048  # the adaptor's, prefixed
    assert "requested=2 KiB" in repr(counted)
    with pytest.raises(InvalidResourceError):
        Counting(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidResourceError, match=r"call it, e\.g\. Pool\(\)"):
        Counting(Pool)  # type: ignore[arg-type]
