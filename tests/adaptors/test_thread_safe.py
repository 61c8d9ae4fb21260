"""ThreadSafe: one lock around every call; 8 threads on a pool lose and duplicate nothing."""

from __future__ import annotations

import threading

import pytest
from _adaptor_stress import stress
from _adaptor_upstreams import BufferMemory

from tensorarena.adaptors import ThreadSafe
from tensorarena.core import STRATEGIES
from tensorarena.errors import DoubleFreeError
from tensorarena.memory.growth import NextPowerOfTwo, SameAsRequested
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool


def test_eight_threads_on_a_thread_safe_pool() -> None:
    upstream = BufferMemory()
    pool = Pool(upstream, initial_size="64KiB", growth=SameAsRequested())
    stress(ThreadSafe(pool), threads=8, operations=1500, seed=1)
    pool._check_invariants()
    stats = pool.statistics()
    assert stats.allocation_count == 0 and stats.allocated_bytes == 0
    assert stats.total_allocations == stats.total_deallocations > 1000
    pool.trim()
    assert upstream.live == 0


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_eight_threads_on_every_strategy_over_mmap_memory(strategy: str) -> None:
    upstream = HostMemory()
    pool = Pool(upstream, strategy=strategy, initial_size="256KiB", growth=NextPowerOfTwo())
    stress(ThreadSafe(pool), threads=8, operations=600, seed=sum(map(ord, strategy)))
    pool._check_invariants()
    assert len(pool) == 0
    pool.trim()
    assert upstream.live_blocks() == {}


def test_upstream_is_read_only_and_calls_are_forwarded_under_the_lock() -> None:
    pool = Pool(BufferMemory(), initial_size="4KiB")
    safe = ThreadSafe(pool)
    assert safe.upstream is pool
    with pytest.raises(AttributeError):
        safe.upstream = pool  # type: ignore[misc]
    address = safe.allocate(100)
    assert safe.statistics() == pool.statistics()  # forwarded method
    assert safe.maximum_size is None  # forwarded attribute
    assert len(safe) == 1

    seen_locked: list[bool] = []
    original = pool.trim

    def spying_trim(stream: object = None) -> int:
        # The lock is re-entrant, so probe it from another thread.
        probe = threading.Thread(target=lambda: seen_locked.append(not safe.lock.acquire(False)))
        probe.start()
        probe.join()
        return original(stream)

    pool.trim = spying_trim  # type: ignore[method-assign]
    safe.trim()
    assert seen_locked == [True]
    safe.deallocate(address, 100)
    with pytest.raises(DoubleFreeError):
        safe.deallocate(address, 100)
    with pytest.raises(AttributeError):
        safe.no_such_method()
    assert "ThreadSafe(Pool(" in repr(safe)


def test_rejects_a_non_resource() -> None:
    with pytest.raises(TypeError):
        ThreadSafe(42)  # type: ignore[arg-type]
