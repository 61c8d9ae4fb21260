"""ThreadCached: per-thread reuse, bounds, flushes (explicit and at thread end), cross-thread
frees, double frees caught, and 8 threads that lose and duplicate nothing."""

from __future__ import annotations

import gc
import threading

import pytest

from _stress import stress
from _upstreams import BufferMemory
from tensorarena.adaptors import ThreadCached, ThreadSafe
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    SizeMismatchError,
)
from tensorarena.memory.growth import SameAsRequested
from tensorarena.memory.pool import Pool

KiB = 1024
MiB = 1024 * KiB


def in_thread(function: object) -> None:
    thread = threading.Thread(target=function)  # type: ignore[arg-type]
    thread.start()
    thread.join()


def test_a_freed_small_block_is_reused_by_the_same_thread_without_the_upstream() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(100)
    cached.deallocate(address, 100)
    assert upstream.live == 1  # kept in the cache, not given back
    assert cached.allocate(100) == address
    assert upstream.allocations == 1
    stats = cached.statistics()
    assert (stats.hits, stats.misses, stats.live_blocks) == (1, 1, 1)
    assert stats.hit_rate == 0.5


def test_buckets_are_keyed_by_size_and_alignment() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(100, alignment=64)
    cached.deallocate(address, 100)
    other = cached.allocate(100, alignment=256)  # same size, other alignment: a miss
    assert other != address and other % 256 == 0
    assert cached.allocate(101, alignment=64) != address  # other size: a miss
    assert cached.allocate(100, alignment=64) == address
    assert cached.statistics().hits == 1


def test_large_blocks_and_stream_ordered_blocks_bypass_the_cache() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_block_size="4KiB")
    big = cached.allocate(8 * KiB)
    cached.deallocate(big, 8 * KiB)
    streamed = cached.allocate(100, stream="s1")
    cached.deallocate(streamed, 100, stream="s1")
    assert upstream.live == 0 and upstream.deallocations == 2
    assert cached.statistics().cached_blocks == 0


def test_a_cache_over_its_bounds_is_trimmed_to_half_oldest_first() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_cached_blocks=8, max_cached_bytes="1MiB")
    blocks = [cached.allocate(64) for _ in range(9)]
    for address in blocks:
        cached.deallocate(address, 64)
    stats = cached.statistics()
    assert stats.cached_blocks == 4  # 9 > 8: trimmed back to 8 // 2
    assert upstream.live == 4 and upstream.deallocations == 5
    assert {cached.allocate(64) for _ in range(4)} == set(blocks[-4:])  # the newest stayed

    by_bytes = ThreadCached(BufferMemory(), max_cached_bytes="4KiB")
    blocks = [by_bytes.allocate(1 * KiB) for _ in range(5)]
    for address in blocks:
        by_bytes.deallocate(address, 1 * KiB)
    assert by_bytes.statistics().cached_bytes == 2 * KiB


def test_flush_empties_only_the_calling_threads_cache() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    cached.deallocate(cached.allocate(100), 100)
    in_thread(cached.flush)  # another thread: nothing of ours to flush
    assert cached.statistics().cached_blocks == 1
    cached.flush()
    assert cached.statistics().cached_blocks == 0 and upstream.live == 0


def test_flush_all_empties_every_threads_cache() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    ready, release = threading.Barrier(4), threading.Event()

    def park_a_block() -> None:
        cached.deallocate(cached.allocate(200), 200)
        ready.wait()
        release.wait()  # stay alive so only flush_all can empty this cache

    threads = [threading.Thread(target=park_a_block) for _ in range(3)]
    for thread in threads:
        thread.start()
    ready.wait()
    stats = cached.statistics()
    assert (stats.threads, stats.cached_blocks) == (3, 3)
    cached.flush_all()
    assert cached.statistics().cached_blocks == 0 and upstream.live == 0
    release.set()
    for thread in threads:
        thread.join()


def test_a_threads_cache_is_flushed_when_the_thread_ends() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)

    def work() -> None:
        blocks = [cached.allocate(128) for _ in range(10)]
        for address in blocks:
            cached.deallocate(address, 128)
        assert cached.statistics().cached_blocks == 10

    in_thread(work)
    gc.collect()
    stats = cached.statistics()
    assert stats.threads == 0 and stats.cached_blocks == 0
    assert stats.misses == 10  # counters of the ended thread survive it
    assert upstream.live == 0 and upstream.deallocations == 10


def test_a_block_freed_by_another_thread_goes_into_that_threads_cache() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(300)
    reused: list[int] = []

    def free_and_reuse() -> None:
        cached.deallocate(address, 300)
        reused.append(cached.allocate(300))  # served from this thread's cache
        cached.deallocate(reused[0], 300)

    in_thread(free_and_reuse)
    assert reused == [address]
    gc.collect()
    assert upstream.live == 0  # the other thread ended, its cache went back upstream


def test_double_frees_are_caught_in_the_cache_and_after_a_flush() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(100)
    cached.deallocate(address, 100)
    before = cached.statistics()
    with pytest.raises(DoubleFreeError, match="thread cache"):
        cached.deallocate(address, 100)
    caught: list[BaseException] = []

    def free_again() -> None:
        try:
            cached.deallocate(address, 100)
        except DoubleFreeError as exc:  # a double free seen from another thread's side
            caught.append(exc)

    in_thread(free_again)
    assert len(caught) == 1
    assert cached.statistics() == before
    assert cached.allocate(100) == address
    assert cached.statistics().cached_blocks == 0  # cached once, handed out once
    cached.deallocate(address, 100)
    cached.flush()
    with pytest.raises(InvalidAddressError):
        cached.deallocate(address, 100)


def test_bad_frees_and_requests_change_nothing() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(100)
    before = cached.statistics()
    with pytest.raises(SizeMismatchError):
        cached.deallocate(address, 99)
    with pytest.raises(InvalidAddressError):
        cached.deallocate(address + 1, 100)
    with pytest.raises(InvalidAddressError):
        cached.deallocate("nope", 100)  # type: ignore[arg-type]
    with pytest.raises(InvalidAlignmentError):
        cached.allocate(100, alignment=3)
    with pytest.raises(ValueError):
        cached.allocate(-1)
    assert cached.statistics() == before and upstream.allocations == 1
    cached.deallocate(address, 100)  # still live after all that


@pytest.mark.parametrize("bounds", [
    {"max_block_size": None}, {"max_cached_bytes": None}, {"max_cached_bytes": 1.5},
    {"max_cached_blocks": None}, {"max_cached_blocks": 1.5}, {"max_cached_blocks": -1},
    {"max_cached_blocks": "8"},
])
def test_bad_bounds_are_refused_with_our_error_in_either_build(bounds: dict[str, object]) -> None:
    # compiled, a declared parameter type would raise a bare TypeError at the call instead
    with pytest.raises(InvalidSizeError):
        ThreadCached(BufferMemory(), **bounds)  # type: ignore[arg-type]


def test_an_upstream_failure_leaves_the_block_live() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_block_size=0)  # no caching: frees go straight upstream
    address = cached.allocate(100)

    def refuse(address: int, nbytes: int, stream: object = None) -> None:
        raise OSError("refused")

    real = upstream.deallocate
    upstream.deallocate = refuse  # type: ignore[method-assign]
    with pytest.raises(OSError):
        cached.deallocate(address, 100)
    upstream.deallocate = real  # type: ignore[method-assign]
    assert len(cached) == 1
    cached.deallocate(address, 100)
    assert upstream.live == 0


def test_eight_threads_on_thread_cached_over_a_thread_safe_pool() -> None:
    upstream = BufferMemory()
    pool = Pool(upstream, initial_size="64KiB", growth=SameAsRequested())
    cached = ThreadCached(ThreadSafe(pool), max_cached_blocks=64)
    stress(cached, threads=8, operations=1500, seed=2)
    gc.collect()
    stats = cached.statistics()
    assert stats.hits > 0 and stats.live_blocks == 0
    cached.flush_all()
    pool._check_invariants()
    assert pool.statistics().allocations.current == 0
    pool.trim()
    assert upstream.live == 0


def test_eight_threads_on_thread_cached_over_a_bare_pool() -> None:
    # ThreadCached serialises its own upstream calls, so a bare Pool is safe behind it.
    pool = Pool(BufferMemory(), initial_size="64KiB")
    cached = ThreadCached(pool, max_cached_blocks=16, max_block_size="4KiB")
    stress(cached, threads=8, operations=1500, seed=3)
    cached.flush_all()
    pool._check_invariants()
    assert len(pool) == 0


def test_repr_and_properties() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_block_size="64KiB")
    assert cached.upstream is upstream and cached.max_block_size == 64 * KiB
    cached.deallocate(cached.allocate(100), 100)
    assert "cached=100 B in 1 blocks" in repr(cached)
    with cached:
        pass
    assert upstream.live == 0
    with pytest.raises(TypeError):
        ThreadCached(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError, match="max_cached_blocks"):
        ThreadCached(upstream, max_cached_blocks=-1)
    with pytest.raises(InvalidSizeError, match="max_cached_bytes"):
        ThreadCached(upstream, max_cached_bytes="lots")


def test_cache_disabled_by_zero_bounds_still_works() -> None:
    upstream = BufferMemory()
    cached = ThreadCached(upstream, max_cached_blocks=0)
    for _ in range(3):
        cached.deallocate(cached.allocate(100), 100)
    assert upstream.live == 0 and cached.statistics().cached_blocks == 0


def test_an_exhausted_upstream_is_retried_after_flushing_every_cache() -> None:
    """PyTorch frees its cached blocks and retries before reporting OOM; so do we."""
    from tensorarena.memory.growth import Fixed
    from tensorarena.memory.pool import Pool
    from tensorarena.memory.virtual import VirtualMemory

    pool = Pool(VirtualMemory(), initial_size="2MiB", growth=Fixed())
    cached = ThreadCached(pool, max_block_size="1MiB", max_cached_bytes="8MiB")
    blocks = [cached.allocate(512 * KiB) for _ in range(4)]  # the whole pool
    for address in blocks:
        cached.deallocate(address, 512 * KiB)  # all four now sit in this thread's cache
    assert cached.statistics().cached_bytes == 2 * MiB
    big = cached.allocate(1 * MiB)  # a shape no cache holds: the pool is full of cached blocks
    stats = cached.statistics()
    assert stats.num_alloc_retries == 1 and stats.cached_bytes == 0
    cached.deallocate(big, 1 * MiB)
    cached.flush_all()
    assert len(pool) == 0


def test_integer_like_sizes_are_cached_as_ints_and_flush() -> None:
    import numpy as np

    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    address = cached.allocate(np.int64(100))
    cached.deallocate(address, np.int64(100))
    again = cached.allocate(100)  # the same bucket: a hit
    assert again == address and cached.statistics().hits == 1
    cached.deallocate(again, "100B")
    cached.flush_all()
    assert upstream.live == 0 and cached.statistics().cached_blocks == 0


def test_the_adaptor_is_an_ordinary_resource_adaptor_in_either_build() -> None:
    # The compiled build compiles its body (ThreadCachedCore) as a native class; the public class
    # stays a Python subclass: weakly referenceable (empty() remembers a checked resource through
    # a weak reference), a ResourceAdaptor, with attributes of its own.
    import weakref

    from tensorarena.memory.resource import ResourceAdaptor

    upstream = BufferMemory()
    cached = ThreadCached(upstream)
    assert weakref.ref(cached)() is cached
    assert isinstance(cached, ResourceAdaptor) and cached.upstream is upstream
    assert cached.memory_kind is upstream.memory_kind
    cached.note = "user data"  # type: ignore[attr-defined]
    with cached as entered:
        assert entered is cached
