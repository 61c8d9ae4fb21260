"""Limiting adaptor: a hard cap with an explaining OutOfMemoryError; nothing changes on refusal."""

from __future__ import annotations

import threading

import pytest

from _upstreams import BufferMemory
from tensorarena.adaptors import Limiting, ThreadSafe
from tensorarena.errors import (
    InvalidAddressError,
    InvalidSizeError,
    OutOfMemoryError,
)
from tensorarena.memory.pool import Pool


def test_allocations_up_to_the_limit_succeed_and_beyond_it_fail() -> None:
    upstream = BufferMemory()
    limited = Limiting(upstream, "4KiB")
    a = limited.allocate(3000)
    b = limited.allocate(1096)
    assert limited.requested_bytes == 4096 and limited.available_bytes == 0
    with pytest.raises(OutOfMemoryError) as info:
        limited.allocate(1)
    error = info.value
    assert error.limit == 4096 and error.allocated == 4096 and error.requested == 1
    assert "over the limit of 4 KiB" in str(error)
    assert limited.requested_bytes == 4096 and upstream.allocations == 2
    limited.deallocate(a, 3000)
    assert limited.available_bytes == 3000
    limited.allocate(3000)
    limited.deallocate(b, 1096)


def test_refusals_and_failures_change_nothing() -> None:
    upstream = BufferMemory()
    limited = Limiting(upstream, 10_000)
    address = limited.allocate(1000)
    with pytest.raises(InvalidSizeError):
        limited.allocate(0)
    with pytest.raises(InvalidSizeError):
        limited.allocate("a lot")  # type: ignore[arg-type]
    upstream.fail_allocations = True
    with pytest.raises(OutOfMemoryError):
        limited.allocate(100)  # the upstream refused: the budget is given back
    upstream.fail_allocations = False
    with pytest.raises(InvalidAddressError):
        limited.deallocate(address + 8, 1000)
    assert limited.requested_bytes == 1000
    limited.deallocate(address, 1000)
    assert limited.requested_bytes == 0


def test_concurrent_callers_never_overshoot() -> None:
    pool = Pool(BufferMemory(), initial_size="1MiB")
    limited = Limiting(ThreadSafe(pool), "64KiB")
    held: list[int] = []
    lock = threading.Lock()
    refused = [0]

    def grab() -> None:
        for _ in range(200):
            try:
                address = limited.allocate(1024)
            except OutOfMemoryError:
                with lock:
                    refused[0] += 1
                continue
            with lock:
                held.append(address)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(held) == 64 and refused[0] == 8 * 200 - 64
    assert pool.statistics().requested_bytes.current == 64 * 1024 == limited.requested_bytes


def test_properties_and_bad_limits() -> None:
    upstream = BufferMemory()
    limited = Limiting(upstream, "1MiB")
    assert limited.upstream is upstream and limited.limit == 1 << 20
    assert "limit=1 MiB" in repr(limited)
    with pytest.raises(InvalidSizeError):
        Limiting(upstream, -1)
    with pytest.raises(TypeError):
        Limiting("pool", 10)  # type: ignore[arg-type]
