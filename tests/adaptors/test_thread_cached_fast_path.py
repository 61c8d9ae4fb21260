"""ThreadCached's fast path: the last-used cache (taken by thread ident, never once retired), the
int bucket keys (one pair, one key), and the last-used bucket (forgotten when drains delete
buckets). Each mechanism's failure would lose a block or hand out one of the wrong shape."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

import pytest

from _upstreams import BufferMemory
from tensorarena import VirtualMemory
from tensorarena.adaptors import ThreadCached
from tensorarena.adaptors._thread_cache_state import bucket_key, key_nbytes


def run_in_thread(function: Callable[[], object]) -> int:
    """Run ``function`` on a new thread to its end; return that thread's ident."""
    idents: list[int] = []

    def body() -> None:
        idents.append(threading.get_ident())
        function()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return idents[0]


def test_a_thread_given_a_dead_threads_ident_never_takes_its_retired_cache() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    dead = run_in_thread(lambda: cached.deallocate(cached.allocate(100), 100))
    gc.collect()
    assert upstream.live == 0 and cached.statistics().threads == 0  # retired, flushed
    seen: list[tuple[int, int, int]] = []

    def free_one() -> None:
        # If this thread took the retired cache (the last one used, with this same ident), the
        # block would sit in a cache that no flush and no statistics see, and leak at its end.
        cached.deallocate(cached.allocate(200), 200)
        stats = cached.statistics()
        seen.append((stats.threads, stats.cached_blocks, stats.cached_bytes))

    for _ in range(50):  # threads' idents are reused once they end: wait for the dead one's
        if run_in_thread(free_one) == dead:
            break
    else:
        pytest.skip("no new thread was given the ended thread's ident")
    gc.collect()
    assert seen[-1] == (1, 1, 200)  # counted in a registered cache of its own
    assert upstream.live == 0  # and given back when that thread ended
    assert cached.statistics().cached_blocks == 0 and len(cached) == 0


def test_a_flush_all_reaches_a_block_freed_by_a_thread_with_a_reused_ident() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    dead = run_in_thread(lambda: cached.deallocate(cached.allocate(100), 100))
    gc.collect()
    freed = threading.Event()
    release = threading.Event()
    idents: list[int] = []

    def free_and_wait() -> None:
        idents.append(threading.get_ident())
        cached.deallocate(cached.allocate(300), 300)
        freed.set()
        release.wait()

    for _ in range(50):
        freed.clear()
        release.clear()
        thread = threading.Thread(target=free_and_wait)
        thread.start()
        freed.wait()
        if idents[-1] == dead:
            break
        release.set()
        thread.join()
    else:
        pytest.skip("no new thread was given the ended thread's ident")
    try:
        assert upstream.live == 1
        cached.flush_all()  # from this thread: a foreign drain of the live thread's cache
        assert upstream.live == 0 and cached.statistics().cached_blocks == 0
    finally:
        release.set()
        thread.join()


def test_two_threads_taking_the_last_used_cache_from_each_other_keep_their_own() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    barrier = threading.Barrier(2)
    kept: dict[int, list[int]] = {}

    def work(nbytes: int) -> None:
        blocks = [cached.allocate(nbytes) for _ in range(4)]
        for address in blocks:
            cached.deallocate(address, nbytes)
        for _ in range(200):
            barrier.wait()  # the other thread runs between: it takes the last-used cache
            cached.deallocate(cached.allocate(nbytes), nbytes)
        kept[nbytes] = [cached.allocate(nbytes) for _ in range(4)]
        stats = cached.statistics()
        assert stats.misses == 8  # after the first four, every request of each thread hit

    threads = [threading.Thread(target=work, args=(n,)) for n in (64, 128)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(map(len, kept.values())) == [4, 4] and upstream.allocations == 8
    assert not set(kept[64]) & set(kept[128])  # each thread got its own blocks back


def test_bucket_keys_are_one_per_pair_and_give_the_size_back() -> None:
    pairs = [
        (n, a)
        for n in (1, 2, 255, 256, 4096, 1 << 31, (1 << 32) + 1, 1 << 40, 3 << 70)
        for a in (1, 2, 64, 256, 4096, (1 << 31), (1 << 32) - 1, 1 << 32, 1 << 33, 1 << 64)
    ]
    keys = [bucket_key(n, a) for n, a in pairs]
    assert len(set(keys)) == len(pairs)  # no two pairs share a key
    assert [key_nbytes(key) for key in keys] == [n for n, _ in pairs]
    assert bucket_key(1, (1 << 32) - 1) != bucket_key(2, 0)  # the alignment never carries over
    assert isinstance(bucket_key(64, 256), int) and bucket_key(64, 1 << 32) == (64, 1 << 32)


def test_one_size_in_several_alignments_never_shares_a_bucket() -> None:
    cached = ThreadCached(BufferMemory())
    for alignment in (64, 256, 4096):
        cached.deallocate(cached.allocate(4096, alignment), 4096)  # one block per bucket
    for _ in range(3):  # in turn, so the last-used bucket is the wrong one at every call
        for alignment in (4096, 64, 256):
            address = cached.allocate(4096, alignment)
            assert address % alignment == 0
            cached.deallocate(address, 4096)
    stats = cached.statistics()
    assert (stats.misses, stats.hits, stats.cached_blocks) == (3, 9, 3)


def test_huge_sizes_and_alignments_are_cached_under_keys_of_their_own() -> None:
    huge = 1 << 40
    cached = ThreadCached(VirtualMemory(), max_block_size=2 * huge, max_cached_bytes=8 * huge)
    shapes = [(huge, 1 << 33), (huge, 1 << 32), (huge, 4096), (huge + 4096, 4096), (4096, 1 << 33)]
    blocks = {shape: cached.allocate(*shape) for shape in shapes}
    for (nbytes, _), address in blocks.items():
        cached.deallocate(address, nbytes)
    for shape in reversed(shapes):
        assert cached.allocate(*shape) == blocks[shape]  # each from its own bucket
    stats = cached.statistics()
    assert (stats.hits, stats.misses, stats.cached_blocks) == (5, 5, 0)


def test_a_drain_that_deletes_the_last_used_bucket_loses_no_block() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    first = cached.allocate(100)
    cached.deallocate(first, 100)
    kept = cached.allocate(100)  # a hit: that bucket is now the last used (and empty)
    other = cached.allocate(100)  # a miss
    cached.flush()  # an owner drain: deletes the emptied bucket
    cached.deallocate(kept, 100)  # must go into a bucket the cache still has
    cached.deallocate(other, 100)
    assert cached.statistics().cached_blocks == 2
    cached.flush()
    assert upstream.live == 0 and cached.statistics().cached_blocks == 0


def test_a_bounded_cache_trimming_the_last_used_bucket_keeps_the_counts_exact() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_cached_blocks=3)  # trims to 1 block when over 3
    for round_ in range(20):
        blocks = [cached.allocate(64 << (round_ % 3)) for _ in range(5)]
        for address in blocks:
            cached.deallocate(address, 64 << (round_ % 3))
        stats = cached.statistics()
        assert stats.cached_blocks <= 3 and upstream.live == stats.cached_blocks
    cached.flush()
    assert upstream.live == 0
