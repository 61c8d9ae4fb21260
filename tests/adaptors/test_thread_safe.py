"""ThreadSafe: one lock around every call; 8 threads on a pool lose and duplicate nothing."""

from __future__ import annotations

import threading

import pytest

from _stress import stress
from _upstreams import BufferMemory
from tensorarena.adaptors import ThreadSafe
from tensorarena.core import STRATEGIES
from tensorarena.errors import DoubleFreeError, InvalidResourceError
from tensorarena.memory.growth import NextPowerOfTwo, SameAsRequested
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool


def test_eight_threads_on_a_thread_safe_pool() -> None:
    upstream = BufferMemory()
    pool = Pool(upstream, initial_size="64KiB", growth=SameAsRequested())
    stress(ThreadSafe(pool), threads=8, operations=1500, seed=1)
    pool._check_invariants()
    stats = pool.statistics()
    assert stats.allocations.current == 0 and stats.requested_bytes.current == 0
    assert stats.allocations.total == stats.allocations.freed > 1000
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


def test_upstream_is_read_only_and_calls_run_under_the_lock() -> None:
    pool = Pool(BufferMemory(), initial_size="4KiB")
    safe = ThreadSafe(pool)
    assert safe.upstream is pool and safe.memory_kind is pool.memory_kind
    with pytest.raises(AttributeError):
        safe.upstream = pool  # type: ignore[misc]

    seen_locked: list[bool] = []
    original = pool.allocate

    def spying_allocate(nbytes: int, alignment: int = 256, stream: object = None) -> int:
        # The lock is re-entrant, so probe it from another thread.
        probe = threading.Thread(target=lambda: seen_locked.append(not safe.lock.acquire(False)))
        probe.start()
        probe.join()
        return original(nbytes, alignment, stream)

    pool.allocate = spying_allocate  # type: ignore[method-assign]
    address = safe.allocate(100)
    assert seen_locked == [True]
    safe.deallocate(address, 100)
    with pytest.raises(DoubleFreeError):
        safe.deallocate(address, 100)
    assert "ThreadSafe(Pool(" in repr(safe)


def test_nothing_is_forwarded_dynamically() -> None:
    """reset()/trim() reached through the adaptor used to run on the pool unlocked: the adaptor
    exposes the protocol and its upstream only (the pool has its own lock)."""
    safe = ThreadSafe(Pool(BufferMemory(), initial_size="4KiB"))
    for name in ("reset", "trim", "statistics", "maximum_size", "no_such_method"):
        assert not hasattr(safe, name), name


def test_rejects_a_non_resource() -> None:
    with pytest.raises(InvalidResourceError):
        ThreadSafe(42)  # type: ignore[arg-type]
