"""``tensorarena.torch.NativePool`` as a memory resource, its books in C++ and in Python alike
(torch/native_pool.py, torch/_native_pool_book.py, interop/_torch_cpu_native_pool.cpp)."""

from __future__ import annotations

import gc
import itertools
import random
import threading
import weakref
from typing import Any

import pytest

import tensorarena as ta
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidSizeError,
    OutOfMemoryError,
    ResourceClosedError,
    SizeMismatchError,
)
from tensorarena.torch import NativePool


@pytest.fixture(params=["native", "python"])
def books(request: Any) -> bool:
    if request.param == "native":
        request.getfixturevalue("shim")  # skips where the shim cannot be built
    return request.param == "native"


def make(books: bool, *args: Any, **kwargs: Any) -> NativePool:
    return NativePool(*args, native=books, **kwargs)


def test_blocks_are_aligned_inside_the_arena_and_never_overlap(books: bool) -> None:
    pool = make(books, size="1MiB")
    assert pool.native is books and pool.capacity == 1 << 20 and pool.base % 4096 == 0
    rng = random.Random(5)
    live: dict[int, int] = {}
    for _ in range(3000):
        if live and rng.random() < 0.5:
            address = rng.choice(list(live))
            pool.deallocate(address, live.pop(address))
            continue
        nbytes, alignment = rng.randrange(1, 9000), rng.choice([1, 64, 256, 4096])
        try:
            address = pool.allocate(nbytes, alignment)
        except OutOfMemoryError:
            continue
        assert address % max(alignment, 64) == 0 and pool.owns(address)
        assert pool.owns(address + nbytes - 1)
        live[address] = nbytes
        spans = sorted((a, a + n) for a, n in live.items())
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert pool.live_blocks() == live
    stats = pool.statistics()
    assert stats.allocations.current == len(live)
    assert stats.requested_bytes.current == sum(live.values())
    assert stats.free_bytes + stats.allocated_bytes.current == pool.capacity
    for address, nbytes in live.items():
        pool.deallocate(address, nbytes)
    assert pool.free_extents() == [(pool.base, pool.capacity)]  # coalesced back into one


def test_the_exact_fit_is_served_and_one_byte_more_is_refused(books: bool) -> None:
    pool = make(books, size=4096)
    whole = pool.allocate(4096, 64)
    assert whole == pool.base and pool.statistics().free_bytes == 0
    with pytest.raises(OutOfMemoryError) as refused:
        pool.allocate(1, 64)
    assert refused.value.capacity == 4096 and not refused.value.is_fragmentation
    pool.deallocate(whole, 4096)
    with pytest.raises(OutOfMemoryError, match="does not grow"):
        pool.allocate(4097, 64)
    assert pool.statistics().num_ooms == 2 and pool.statistics().allocations.current == 0
    assert pool.allocate(4096, 4096) == pool.base


def test_best_fit_takes_the_smallest_hole_and_first_fit_the_lowest(books: bool) -> None:
    for strategy, hole in (("best_fit", 2), ("first_fit", 0)):
        pool = make(books, size="64KiB", strategy=strategy)
        blocks = [pool.allocate(n, 64) for n in (1024, 64, 512, 64, 4096)]
        pool.deallocate(blocks[0], 1024)  # a 1024-byte hole at the base...
        pool.deallocate(blocks[2], 512)  # ...and a 512-byte one after it
        assert pool.allocate(500, 64) == blocks[hole]
        assert pool.strategy == strategy


def test_bad_frees_say_why_and_change_nothing(books: bool) -> None:
    pool = make(books, size="64KiB")
    kept = pool.allocate(1000, 64)
    freed = pool.allocate(100, 64)
    pool.deallocate(freed, 100)
    before = (pool.statistics(), pool.free_extents())
    with pytest.raises(DoubleFreeError):
        pool.deallocate(freed, 100)
    with pytest.raises(SizeMismatchError) as mismatch:
        pool.deallocate(kept, 999)
    assert mismatch.value.allocated == 1000
    with pytest.raises(InvalidAddressError, match="inside a live block"):
        pool.deallocate(kept + 64, 1000)
    with pytest.raises(InvalidAddressError, match="not a block of"):
        pool.deallocate(pool.base + pool.capacity, 10)
    with pytest.raises(InvalidAddressError):
        pool.deallocate(1 << 70, 10)
    with pytest.raises(InvalidAddressError):
        pool.deallocate(-1, 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError):
        pool.allocate(0)
    with pytest.raises(InvalidAlignmentError):
        pool.allocate(10, 3)
    assert (pool.statistics(), pool.free_extents()) == before
    pool.deallocate(kept, 1000)
    with pytest.raises(InvalidArgumentError):
        NativePool(size="1MiB", strategy="worst_fit")  # type: ignore[arg-type]
    with pytest.raises(ta.errors.InvalidResourceError):
        NativePool(ta.HostMemory, size="1MiB")  # type: ignore[arg-type]


def test_what_the_arena_cannot_hold_goes_to_the_fallback_and_back(books: bool) -> None:
    upstream = ta.Pool(ta.HostMemory())
    pool = make(books, size=4096, fallback=upstream)
    inside = pool.allocate(4096, 64)
    outside = pool.allocate(100, 64)
    assert not pool.owns(outside) and upstream.statistics().allocations.current == 1
    assert pool.fallbacks == ta.Count(1, 1, 1) and pool.live_blocks() == {inside: 4096,
                                                                           outside: 100}
    with pytest.raises(SizeMismatchError):
        pool.deallocate(outside, 99)
    pool.deallocate(outside, 100)
    assert upstream.statistics().allocations.current == 0 and pool.fallbacks.current == 0
    with pytest.raises(InvalidAddressError):
        pool.deallocate(outside, 100)
    pool.deallocate(inside, 4096)


def test_closing_refuses_new_blocks_and_gives_the_arena_back_after_the_last(books: bool) -> None:
    upstream = ta.Pool(ta.HostMemory())
    with make(books, upstream, size="64KiB") as pool:
        block = pool.allocate(100)
    assert pool.closed and upstream.statistics().allocations.current == 1
    with pytest.raises(ResourceClosedError):
        pool.allocate(100)
    pool.deallocate(block, 100)
    assert upstream.statistics().allocations.current == 0
    assert pool.statistics().reserved_bytes.current == 0
    pool.close()  # twice: nothing


def test_a_collected_pool_gives_its_arena_back(books: bool) -> None:
    upstream = ta.Pool(ta.HostMemory())
    pool = make(books, upstream, size="64KiB")
    assert upstream.statistics().allocations.current == 1
    gone = weakref.ref(pool)
    del pool
    gc.collect()
    assert gone() is None and upstream.statistics().allocations.current == 0


def test_both_books_place_blocks_alike(shim: Any) -> None:
    pools = [NativePool(size="256KiB", native=True), NativePool(size="256KiB", native=False)]
    rng = random.Random(11)
    lives: list[dict[int, int]] = [{}, {}]
    for _ in range(2000):
        if lives[0] and rng.random() < 0.45:
            index = rng.randrange(len(lives[0]))
            for pool, live in zip(pools, lives, strict=True):
                address = sorted(live)[index]
                pool.deallocate(address, live.pop(address))
            continue
        nbytes, alignment = rng.randrange(1, 5000), rng.choice([64, 256, 1024])
        got = []
        for pool, live in zip(pools, lives, strict=True):
            try:
                address = pool.allocate(nbytes, alignment)
            except OutOfMemoryError:
                got.append(None)
                continue
            live[address] = nbytes
            got.append(address - pool.base)
        assert got[0] == got[1]
    assert pools[0].statistics() == pools[1].statistics()


def test_threads_allocating_and_freeing_at_once_lose_nothing(books: bool) -> None:
    pool = make(books, size="4MiB")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[tuple[int, int]] = []
        try:
            for _ in range(2000):
                if mine and rng.random() < 0.5:
                    pool.deallocate(*mine.pop(rng.randrange(len(mine))))
                else:
                    nbytes = rng.randrange(1, 4000)
                    mine.append((pool.allocate(nbytes, 64), nbytes))
            for block in mine:
                pool.deallocate(*block)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    stats = pool.statistics()
    assert stats.allocations.current == 0 and stats.free_extents == 1


def test_thousands_of_live_blocks_are_found_and_freed_in_any_order(books: bool) -> None:
    pool = make(books, size="1MiB")
    blocks = [pool.allocate(64, 64) for _ in range(5000)]  # past the live table's first growth
    assert blocks == [pool.base + 64 * i for i in range(5000)]
    random.Random(3).shuffle(blocks)
    for address in blocks[:2500]:
        pool.deallocate(address, 64)
    assert sorted(pool.live_blocks()) == sorted(blocks[2500:])
    with pytest.raises(DoubleFreeError):
        pool.deallocate(blocks[0], 64)
    for address in blocks[2500:]:
        pool.deallocate(address, 64)
    assert pool.free_extents() == [(pool.base, pool.capacity)]


def test_where_the_shim_cannot_be_built_the_books_are_kept_in_python(monkeypatch: Any) -> None:
    from tensorarena.interop import torch_cpu_shim

    monkeypatch.setattr(torch_cpu_shim, "unavailable", lambda: "no C++ compiler (test)")
    pool = NativePool(size="64KiB")
    assert not pool.native and "python" in repr(pool)
    pool.deallocate(pool.allocate(100), 100)
    with pytest.raises(ta.errors.ShimUnavailableError, match="no C\\+\\+ compiler"):
        NativePool(size="64KiB", native=True)
    with pytest.raises(InvalidArgumentError):
        NativePool(size="64KiB", native=1)  # type: ignore[arg-type]
