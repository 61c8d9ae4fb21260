"""ThreadCached without a lock on the owner's hot path: ``flush_all`` from another thread racing
the owners' hits and puts loses no block, hands none out twice and keeps the counts right; a
refused foreign flush keeps its blocks (as orphans when their bucket is gone)."""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator

import pytest

from _upstreams import BufferMemory
from tensorarena.adaptors import ThreadCached
from tensorarena.adaptors._thread_cache_state import bucket_key
from tensorarena.errors import DoubleFreeError
from tensorarena.memory.pool import Pool

SHAPES = [(64, 64), (256, 64), (256, 256), (1024, 64), (4096, 512)]  # (nbytes, alignment)


def flush_all_on_another_thread(cached: ThreadCached) -> list[BaseException]:
    """Run ``cached.flush_all()`` on a fresh thread (a foreign drain); return what it raised."""
    caught: list[BaseException] = []

    def flush_all() -> None:
        try:
            cached.flush_all()
        except OSError as exc:
            caught.append(exc)

    flusher = threading.Thread(target=flush_all)
    flusher.start()
    flusher.join()
    return caught


@pytest.fixture
def fast_switching() -> Iterator[None]:
    # Switch threads often so the owners' lock-free pops and the flusher's pop(0)s interleave.
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize(("workers", "max_blocks"), [(6, 1024), (4, 8)])
def test_flush_all_racing_the_owners_loses_and_duplicates_nothing(
    fast_switching: None, workers: int, max_blocks: int
) -> None:
    pool = Pool(BufferMemory(), initial_size="256KiB")
    cached = ThreadCached(pool, max_cached_blocks=max_blocks)  # 8: owners' own drains race too
    live: dict[int, int] = {}  # address -> worker holding it, for every block handed out now
    live_lock = threading.Lock()
    problems: list[str] = []
    done = threading.Event()
    flushes = 0
    allocations = 0

    def work(seed: int) -> None:
        nonlocal allocations
        rng = random.Random(seed)
        held: list[tuple[int, int]] = []
        for _ in range(2500):
            if held and (len(held) >= 6 or rng.random() < 0.5):
                address, nbytes = held.pop(rng.randrange(len(held)))
                with live_lock:  # forget it before freeing: it may be handed out at once
                    del live[address]
                cached.deallocate(address, nbytes)
            else:
                nbytes, alignment = rng.choice(SHAPES)
                address = cached.allocate(nbytes, alignment)
                if address % alignment:
                    problems.append(f"{address:#x} not aligned to {alignment}")
                with live_lock:
                    allocations += 1
                    if address in live:
                        problems.append(f"{address:#x} handed out twice")
                    live[address] = seed
                held.append((address, nbytes))
        for address, nbytes in held:
            with live_lock:
                del live[address]
            cached.deallocate(address, nbytes)

    def flush() -> None:
        nonlocal flushes
        while not done.is_set() and flushes < 1_000_000:  # bounded even if a worker hangs
            cached.flush_all()
            flushes += 1

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(workers)]
    flusher = threading.Thread(target=flush)
    flusher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    flusher.join()

    assert problems == []
    assert flushes > 0 and live == {}
    cached.flush_all()
    stats = cached.statistics()
    assert (stats.cached_blocks, stats.cached_bytes, stats.live_blocks) == (0, 0, 0)
    assert stats.num_upstream_allocs == stats.num_upstream_frees
    assert stats.hits + stats.misses == allocations  # every request counted once
    assert stats.misses == stats.num_upstream_allocs  # every shape is cacheable here
    pool._check_invariants()
    assert pool.statistics().allocations.current == 0 and len(pool) == 0


def test_counts_stay_exact_after_foreign_flushes() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_cached_blocks=4, max_cached_bytes="1MiB")
    blocks = [cached.allocate(64) for _ in range(4)]
    for address in blocks:
        cached.deallocate(address, 64)
    flusher = threading.Thread(target=cached.flush_all)
    flusher.start()
    flusher.join()  # a foreign drain: the owner's counters stay, the drained ones grow
    stats = cached.statistics()
    assert (stats.cached_blocks, stats.cached_bytes, upstream.live) == (0, 0, 0)
    # The bound is checked on what is really cached: four more frees fit without a trim.
    blocks = [cached.allocate(64) for _ in range(4)]
    for address in blocks:
        cached.deallocate(address, 64)
    assert cached.statistics().cached_blocks == 4 and upstream.live == 4
    cached.deallocate(cached.allocate(64), 64)  # a hit and a put: still 4
    cached.deallocate(cached.allocate(128), 128)  # 5 > 4: trimmed to 2
    assert cached.statistics().cached_blocks == 2
    stats = cached.statistics()
    assert (stats.hits, stats.misses) == (1, 9)
    cached.flush()
    assert cached.statistics().cached_blocks == 0 and upstream.live == 0


def test_a_refused_foreign_flush_keeps_the_block_as_an_orphan_the_owner_adopts() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(100)
    cached.deallocate(address, 100)
    cache = cached._local.cache
    real = upstream.deallocate

    def refuse(address: int, nbytes: int, stream: object = None) -> None:
        # Between the foreign drain and its restore the owner trimmed the emptied bucket away
        # (what an owner drain does): the block has no bucket to go back to.
        cache.buckets.clear()
        raise OSError("refused")

    upstream.deallocate = refuse  # type: ignore[method-assign]
    caught = flush_all_on_another_thread(cached)
    upstream.deallocate = real  # type: ignore[method-assign]
    assert len(caught) == 1
    assert cache.orphans == [(address, bucket_key(100, 256))] and cache.buckets == {}
    stats = cached.statistics()
    assert (stats.cached_blocks, stats.cached_bytes) == (1, 100)  # kept, not lost
    with pytest.raises(DoubleFreeError):
        cached.deallocate(address, 100)  # the orphan is still known to be cached
    assert cached.allocate(100) == address  # the owner adopts it and hands it out once
    assert cache.orphans == [] and cached.statistics().cached_blocks == 0
    assert upstream.allocations == 1
    cached.deallocate(address, 100)
    cached.flush()
    assert upstream.live == 0


def test_a_refused_foreign_flush_puts_the_block_back_into_its_bucket() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    blocks = [cached.allocate(100) for _ in range(3)]
    for address in blocks:
        cached.deallocate(address, 100)
    real = upstream.deallocate
    calls = 0

    def refuse_the_second(address: int, nbytes: int, stream: object = None) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("refused")
        real(address, nbytes, stream)

    upstream.deallocate = refuse_the_second  # type: ignore[method-assign]
    caught = flush_all_on_another_thread(cached)
    upstream.deallocate = real  # type: ignore[method-assign]
    assert len(caught) == 1
    cache = cached._local.cache
    assert cache.buckets[bucket_key(100, 256)] == blocks[1:] and cache.orphans == []
    assert cached.statistics().cached_blocks == 2 and upstream.live == 2
    assert cached.allocate(100) == blocks[2]  # newest first, as before the flush
    cached.deallocate(blocks[2], 100)
    cached.flush_all()  # now from the owner thread
    assert cached.statistics().cached_blocks == 0 and upstream.live == 0
