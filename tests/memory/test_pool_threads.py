"""A bare ``Pool`` is thread-safe: four threads lose nothing and hand out nothing twice.

Before, a bare pool used from 4 threads raised InvalidAddressError in 3 of them and leaked 108
blocks silently (RMM's, PyTorch's and CuPy's pools are thread-safe; ours now is too).
"""

from __future__ import annotations

import threading

import pytest

from _stress import stress
from tensorarena.memory.growth import SameAsRequested
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool


@pytest.mark.parametrize("strategy", ["first_fit", "best_fit", "tlsf"])
def test_four_threads_on_a_bare_pool(strategy: str) -> None:
    host = HostMemory()
    pool = Pool(host, strategy=strategy, initial_size="64KiB", growth=SameAsRequested())
    assert pool.thread_safe
    stress(pool, threads=4, operations=1500, seed=sum(map(ord, strategy)))
    pool._check_invariants()
    stats = pool.statistics()
    assert stats.allocations.current == 0 and stats.requested_bytes.current == 0
    assert stats.allocations.total == stats.allocations.freed > 1000
    pool.trim()
    assert host.live_blocks() == {}


def test_statistics_and_trim_from_other_threads_while_allocating() -> None:
    pool = Pool(HostMemory(), initial_size="64KiB", growth=SameAsRequested())
    done = threading.Event()
    errors: list[BaseException] = []

    def observer() -> None:
        try:
            while not done.is_set():
                stats = pool.statistics()
                assert stats.allocated_bytes.current <= stats.reserved_bytes.current
                pool.trim()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    watcher = threading.Thread(target=observer)
    watcher.start()
    try:
        stress(pool, threads=3, operations=800, seed=7)
    finally:
        done.set()
        watcher.join()
    assert not errors, errors
    pool._check_invariants()
    assert len(pool) == 0


def test_an_unlocked_pool_is_an_explicit_choice() -> None:
    pool = Pool(HostMemory(), thread_safe=False)
    assert not pool.thread_safe
    address = pool.allocate(100)  # one thread: as correct as the locked pool
    pool.deallocate(address, 100)
    assert pool.statistics().allocations.total == 1
