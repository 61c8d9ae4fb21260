"""Pool: growth, own arenas for large requests, trim/reset, limit, errors that change nothing."""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import random
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tensorarena.core import STRATEGIES
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidResourceError,
    InvalidSizeError,
    OutOfMemoryError,
    ResourceClosedError,
    ResourceInUseError,
    SizeMismatchError,
    UnknownNameError,
)
from tensorarena.memory.growth import Doubling, Fixed, NextPowerOfTwo, SameAsRequested
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.memory_kind import MemoryKind
from tensorarena.report import memory_summary
from tensorarena.stats import MemoryStatistics

KiB = 1024
MiB = 1024 * KiB


class CountingMemory:
    memory_kind = MemoryKind.ADDRESS_SPACE

    """Address space that counts its calls and can be told to fail (or to return junk)."""

    def __init__(self) -> None:
        self.inner = VirtualMemory()
        self.allocations = 0
        self.deallocations = 0
        self.fail = False

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        if self.fail:
            raise OutOfMemoryError(nbytes, free=0, largest_free=0, capacity=0, detail="injected")
        address = self.inner.allocate(nbytes, alignment, stream)
        self.allocations += 1
        return address

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.inner.deallocate(address, nbytes, stream)
        self.deallocations += 1


class BufferMemory:
    memory_kind = MemoryKind.HOST

    """Real bytes: one ctypes buffer per upstream allocation."""

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        buffer = ctypes.create_string_buffer(nbytes + alignment)
        address = (ctypes.addressof(buffer) + alignment - 1) & -alignment
        self.buffers[address] = buffer
        return address

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        del self.buffers[address]


def arena_sizes(pool: Pool) -> list[int]:
    return [arena.capacity for arena in pool.arenas]


def one_more_oom(stats: MemoryStatistics) -> MemoryStatistics:
    """``stats`` after one refused request: only the OOM count moves (as in PyTorch)."""
    return dataclasses.replace(stats, num_ooms=stats.num_ooms + 1)


def arena_index(pool: Pool, address: int) -> int:
    """Which arena (in creation order) holds ``address``."""
    (index,) = [
        i
        for i, arena in enumerate(pool.arenas)
        if arena.base <= address < arena.base + arena.capacity
    ]
    return index


# --- growth ---------------------------------------------------------------------------------


def test_initial_arena_is_taken_at_once() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="64KiB")
    assert arena_sizes(pool) == [64 * KiB]
    assert upstream.allocations == 1
    assert pool.statistics().reserved_bytes.current == 64 * KiB


def test_lazy_pool_takes_nothing_until_the_first_request() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size=0, growth=SameAsRequested())
    assert upstream.allocations == 0
    pool.allocate(1000)
    assert arena_sizes(pool) == [1024]


def test_fixed_never_grows() -> None:
    pool = Pool(CountingMemory(), initial_size="4KiB", growth=Fixed())
    blocks = [pool.allocate(1 * KiB) for _ in range(4)]
    before = pool.statistics()
    with pytest.raises(OutOfMemoryError, match="refuses"):
        pool.allocate(1)
    assert pool.statistics() == one_more_oom(before)
    assert arena_sizes(pool) == [4 * KiB]
    pool.deallocate(blocks[0], 1 * KiB)
    pool.allocate(1 * KiB)  # freed space is reused


def test_same_as_requested_adds_arenas_of_the_request_size() -> None:
    pool = Pool(CountingMemory(), initial_size="1KiB", growth=SameAsRequested())
    pool.allocate(1 * KiB)
    pool.allocate(3000)
    pool.allocate(1)
    assert arena_sizes(pool) == [1024, 3072, 256]  # arena sizes are multiples of 256 bytes


def test_next_power_of_two_doubles_each_arena() -> None:
    pool = Pool(CountingMemory(), initial_size="1KiB", growth=NextPowerOfTwo())
    for _ in range(8):
        pool.allocate(1 * KiB)
    assert arena_sizes(pool) == [1024, 2048, 4096, 8192]


def test_doubling_is_capped_at_its_maximum() -> None:
    pool = Pool(CountingMemory(), initial_size="1KiB", growth=Doubling("4KiB"))
    for _ in range(16):
        pool.allocate(1 * KiB)
    assert arena_sizes(pool) == [1024, 1024, 2048, 4096, 4096, 4096]


@pytest.mark.parametrize(
    ("growth", "expected"),
    [(NextPowerOfTwo(), 4 * MiB), (SameAsRequested(), 3 * MiB), (Doubling("1MiB"), 3 * MiB)],
)
def test_a_large_request_gets_its_own_arena(growth: object, expected: int) -> None:
    pool = Pool(CountingMemory(), initial_size="1MiB", growth=growth)  # type: ignore[arg-type]
    small = pool.allocate(100)
    big = pool.allocate(3 * MiB)
    assert arena_sizes(pool) == [1 * MiB, expected]
    assert arena_index(pool, big) == 1 and arena_index(pool, small) == 0


def test_requests_fill_older_arenas_first() -> None:
    pool = Pool(CountingMemory(), initial_size="1KiB", growth=SameAsRequested())
    a = pool.allocate(1 * KiB)
    pool.allocate(1 * KiB)  # second arena
    pool.deallocate(a, 1 * KiB)
    again = pool.allocate(512)
    assert arena_index(pool, again) == 0


def test_an_alignment_above_every_arena_base_gets_a_new_aligned_arena() -> None:
    pool = Pool(BufferMemory(), initial_size="4KiB", growth=SameAsRequested())
    address = pool.allocate(100, alignment=64 * KiB)
    assert address % (64 * KiB) == 0
    pool._check_invariants()


def test_an_empty_pool_restarts_from_its_initial_size() -> None:
    pool = Pool(CountingMemory(), initial_size="8KiB", growth=SameAsRequested())
    pool.trim()
    assert arena_sizes(pool) == []
    pool.allocate(10)
    assert arena_sizes(pool) == [8 * KiB]


# --- trim, reset, close ---------------------------------------------------------------------


def test_trim_gives_empty_arenas_back() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="1KiB", growth=SameAsRequested())
    blocks = [pool.allocate(1 * KiB) for _ in range(4)]
    assert upstream.allocations == 4
    for address in blocks[1:3]:
        pool.deallocate(address, 1 * KiB)
    assert pool.trim() == 2 * KiB
    stats = pool.statistics()
    assert upstream.deallocations == 2 and stats.num_upstream_frees == 2
    assert stats.reserved_bytes.current == 2 * KiB and stats.segments.current == 2
    assert stats.reserved_bytes.freed == 2 * KiB and stats.reserved_bytes.peak == 4 * KiB
    assert pool.trim() == 0
    pool.deallocate(blocks[3], 1 * KiB)  # its arena survived the trim
    pool._check_invariants()


def test_a_failing_upstream_deallocate_keeps_the_arena() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="1KiB")

    def refuse(address: int, nbytes: int, stream: object = None) -> None:
        raise OSError("munmap refused")

    upstream.deallocate = refuse  # type: ignore[method-assign]
    with pytest.raises(OSError):
        pool.trim()
    assert arena_sizes(pool) == [1 * KiB]
    pool._check_invariants()


def test_reset_with_live_blocks_refuses_and_changes_nothing() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="4KiB")
    blocks = [pool.allocate(512) for _ in range(6)]
    before = pool.statistics(), pool.live_blocks()
    with pytest.raises(ResourceInUseError, match=r"6 block\(s\) \(3 KiB\)") as info:
        pool.reset()
    assert info.value.live_blocks == 6 and info.value.live_bytes == 6 * 512
    assert (pool.statistics(), pool.live_blocks()) == before
    for address in blocks:
        pool.deallocate(address, 512)
    pool.reset()  # nothing live: allowed
    pool._check_invariants()


def test_forced_reset_frees_everything_and_old_addresses_are_double_frees() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="4KiB")
    blocks = [pool.allocate(512) for _ in range(6)]
    reserved = pool.statistics().reserved_bytes
    pool.reset(force=True)
    stats = pool.statistics()
    assert stats.requested_bytes.current == 0 and stats.allocated_bytes.current == 0
    assert len(pool) == 0
    assert stats.reserved_bytes == reserved and upstream.deallocations == 0
    assert stats.allocations.freed == 6 and stats.requested_bytes.freed == 6 * 512
    with pytest.raises(DoubleFreeError):
        pool.deallocate(blocks[0], 512)
    assert pool.statistics() == stats
    pool.allocate(512)
    pool._check_invariants()


def test_close_and_context_manager_return_everything_once_it_is_free() -> None:
    upstream = CountingMemory()
    with Pool(upstream, initial_size="4KiB", growth=SameAsRequested()) as pool:
        small = pool.allocate(100)
        pool.deallocate(pool.allocate(8 * KiB), 8 * KiB)
    # The empty 8 KiB arena went back at once; the one holding a live block stays mapped.
    assert upstream.allocations == 2 and upstream.deallocations == 1
    assert pool.closed and arena_sizes(pool) == [4 * KiB]
    with pytest.raises(ResourceClosedError):
        pool.allocate(100)
    pool.deallocate(small, 100)  # its last block: the arena goes back now
    assert upstream.allocations == upstream.deallocations == 2
    assert len(upstream.inner.live_blocks()) == 0 and arena_sizes(pool) == []
    pool.close()  # twice is harmless


def test_explicit_close_defers_the_unmapping_of_arenas_in_use() -> None:
    from tensorarena.memory.host import HostMemory

    host = HostMemory()
    pool = Pool(host, initial_size="64KiB", growth=SameAsRequested())
    address = pool.allocate(4096)
    ctypes.memset(address, 0x11, 4096)
    pool.close()
    assert len(host.live_blocks()) == 1  # still mapped: writing is safe
    ctypes.memset(address, 0x22, 4096)
    assert ctypes.string_at(address, 4096) == b"\x22" * 4096
    pool.deallocate(address, 4096)
    assert host.live_blocks() == {}


def test_a_collected_pool_gives_its_arenas_back() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="4KiB", growth=SameAsRequested())
    pool.allocate(100)
    pool.allocate(8 * KiB)
    del pool
    gc.collect()
    assert upstream.allocations == upstream.deallocations == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS is read from /proc")
def test_trim_over_real_mmap_memory_lowers_the_resident_set() -> None:
    from tensorarena.memory.host import HostMemory

    def rss() -> int:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    pool = Pool(HostMemory(), initial_size=0, growth=SameAsRequested())
    size = 64 * MiB
    address = pool.allocate(size)
    ctypes.memset(address, 0xA5, size)  # fault every page in
    touched = rss()
    pool.deallocate(address, size)
    assert rss() > touched - size // 2  # freed into the pool: still resident
    assert pool.trim() == size
    assert rss() < touched - size // 2


# --- maximum_size ---------------------------------------------------------------------------


def test_maximum_size_caps_growth_and_explains_why() -> None:
    pool = Pool(CountingMemory(), initial_size="4KiB", growth=Doubling("1MiB"), maximum_size="8KiB")
    pool.allocate(3 * KiB)
    pool.allocate(3 * KiB)  # second arena: clamped to the 4 KiB of headroom
    assert arena_sizes(pool) == [4 * KiB, 4 * KiB]
    before = pool.statistics()
    with pytest.raises(OutOfMemoryError) as info:
        pool.allocate(2 * KiB)
    message = str(info.value)
    assert "maximum_size" in message and "allocated 6 KiB" in message
    assert "reserved 8 KiB" in message and "largest free extent 1 KiB" in message
    assert info.value.limit == 8 * KiB and info.value.reserved == 8 * KiB
    assert pool.statistics() == one_more_oom(before)


def test_at_the_limit_empty_arenas_are_given_back_before_failing() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="2KiB", growth=SameAsRequested(), maximum_size="8KiB")
    pool.allocate(2 * KiB)
    three = [pool.allocate(3 * KiB) for _ in range(2)]
    assert arena_sizes(pool) == [2 * KiB, 3 * KiB, 3 * KiB]
    for address in three:
        pool.deallocate(address, 3 * KiB)
    pool.allocate(5 * KiB)  # fits only once the two empty 3 KiB arenas are released
    assert arena_sizes(pool) == [2 * KiB, 5 * KiB]
    assert upstream.deallocations == 2
    pool._check_invariants()


def test_debug_mode_checks_invariants_after_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = Pool(CountingMemory(), debug=True)
    calls: list[int] = []
    original = pool._check_invariants
    monkeypatch.setattr(
        pool, "_check_invariants", lambda level=2: calls.append(level) or original(level)
    )
    address = pool.allocate(100)
    pool.deallocate(address, 100)
    assert len(calls) == 2


def test_initial_size_above_maximum_is_refused() -> None:
    with pytest.raises(InvalidSizeError, match="maximum_size"):
        Pool(CountingMemory(), initial_size="2MiB", maximum_size="1MiB")


# --- errors leave everything unchanged ------------------------------------------------------


@pytest.fixture
def busy_pool() -> tuple[Pool, CountingMemory, list[int]]:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="4KiB", growth=SameAsRequested())
    blocks = [pool.allocate(1000) for _ in range(3)]
    pool.deallocate(blocks.pop(), 1000)
    return pool, upstream, blocks


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda p, b: p.allocate(0), InvalidSizeError),
        (lambda p, b: p.allocate(-5), InvalidSizeError),
        (lambda p, b: p.allocate("lots"), InvalidSizeError),
        (lambda p, b: p.allocate(1.5), InvalidSizeError),
        (lambda p, b: p.allocate(100, alignment=3), InvalidAlignmentError),
        (lambda p, b: p.allocate(100, alignment=0), InvalidAlignmentError),
        (lambda p, b: p.deallocate(b[0], 999), SizeMismatchError),
        (lambda p, b: p.deallocate(b[0], None), InvalidSizeError),
        (lambda p, b: p.deallocate(float(b[0]), 1000), InvalidAddressError),
        (lambda p, b: p.allocate(100, alignment=2**61), InvalidAlignmentError),
        (lambda p, b: p.deallocate(b[0] + 8, 1000), InvalidAddressError),
        (lambda p, b: p.deallocate(12345, 1000), InvalidAddressError),
        (lambda p, b: p.deallocate("0x10", 1000), InvalidAddressError),
        (lambda p, b: p.deallocate(b[0] + 2048, 1000), DoubleFreeError),  # the freed third block
    ],
)
def test_bad_calls_raise_and_change_nothing(
    busy_pool: tuple[Pool, CountingMemory, list[int]], call: object, error: type[Exception]
) -> None:
    pool, upstream, blocks = busy_pool
    before = pool.statistics()
    calls = (upstream.allocations, upstream.deallocations)
    with pytest.raises(error):
        call(pool, blocks)  # type: ignore[operator]
    assert pool.statistics() == before
    assert (upstream.allocations, upstream.deallocations) == calls
    pool._check_invariants()


def test_freeing_into_the_wrong_pool_is_refused() -> None:
    upstream = CountingMemory()
    first, second = Pool(upstream), Pool(upstream)
    address = first.allocate(100)
    before = second.statistics()
    with pytest.raises(InvalidAddressError, match="not allocated by this pool"):
        second.deallocate(address, 100)
    assert second.statistics() == before
    first.deallocate(address, 100)


def test_an_upstream_failure_during_growth_changes_nothing() -> None:
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="1KiB", growth=SameAsRequested())
    pool.allocate(1 * KiB)
    before = pool.statistics()
    upstream.fail = True
    with pytest.raises(OutOfMemoryError, match="upstream refused") as info:
        pool.allocate(1 * KiB)
    assert isinstance(info.value.__cause__, OutOfMemoryError)
    assert pool.statistics() == one_more_oom(before) and arena_sizes(pool) == [1 * KiB]
    upstream.fail = False
    pool.allocate(1 * KiB)


def test_a_misaligned_upstream_is_caught_and_given_back() -> None:
    upstream = CountingMemory()
    upstream.inner.allocate(8, 8)  # move VirtualMemory's cursor off every large alignment
    real_allocate = upstream.allocate

    def crooked(nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return real_allocate(nbytes, 8, stream)  # ignores the alignment asked for

    upstream.allocate = crooked  # type: ignore[method-assign]
    with pytest.raises(InvalidAlignmentError):
        Pool(upstream, initial_size="1KiB")
    assert upstream.allocations == upstream.deallocations == 1


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(InvalidResourceError, match="not object"):
        Pool(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidResourceError, match=r"the class HostMemory: call it"):
        Pool(HostMemory)  # type: ignore[arg-type]
    for growth in ("double", 5, Doubling):
        with pytest.raises(InvalidArgumentError, match="growth policy"):
            Pool(CountingMemory(), growth=growth)  # type: ignore[arg-type]
    with pytest.raises(UnknownNameError, match="unknown strategy 'worst_fit'"):
        Pool(CountingMemory(), strategy="worst_fit")
    with pytest.raises(InvalidArgumentError, match="strategy must be"):
        Pool(CountingMemory(), strategy=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidSizeError, match="must be non-negative, got '-1KiB'"):
        Pool(CountingMemory(), initial_size="-1KiB")
    with pytest.raises(InvalidArgumentError, match="thread_safe"):
        Pool(CountingMemory(), thread_safe="yes")  # type: ignore[arg-type]


# --- statistics, summary, repr --------------------------------------------------------------


def test_statistics_use_pytorch_vocabulary() -> None:
    pool = Pool(CountingMemory(), initial_size="4KiB", growth=SameAsRequested())
    a = pool.allocate(100)
    b = pool.allocate(300, alignment=512)
    stats = pool.statistics()
    assert isinstance(stats, MemoryStatistics)
    assert stats.requested_bytes.current == 400  # requested
    assert stats.allocated_bytes.current == 256 + 512  # rounded up to each alignment
    assert stats.reserved_bytes.current == 4 * KiB  # held from upstream
    assert stats.allocations.current == 2 and stats.segments.current == 1
    pool.deallocate(a, 100)
    pool.deallocate(b, 300)
    stats = pool.statistics()
    assert stats.requested_bytes.peak == 400 and stats.allocated_bytes.peak == 768
    assert stats.allocations.total == stats.allocations.freed == 2
    assert stats.free_bytes == stats.largest_free_bytes == 4 * KiB and stats.fragmentation == 0.0
    with pytest.raises(AttributeError):
        stats.num_ooms = 0  # type: ignore[misc]


def test_fragmentation_is_measured_over_the_pool() -> None:
    pool = Pool(CountingMemory(), initial_size="4KiB", growth=Fixed())
    blocks = [pool.allocate(1 * KiB) for _ in range(4)]
    pool.deallocate(blocks[0], 1 * KiB)
    pool.deallocate(blocks[2], 1 * KiB)
    stats = pool.statistics()
    assert stats.free_bytes == 2 * KiB and stats.largest_free_bytes == 1 * KiB
    assert stats.fragmentation == pytest.approx(0.5)
    with pytest.raises(OutOfMemoryError) as info:
        pool.allocate(2 * KiB)
    assert info.value.is_fragmentation


def test_memory_summary_and_repr_show_live_state() -> None:
    pool = Pool(CountingMemory(), initial_size="1MiB", maximum_size="4MiB")
    pool.allocate(1536)
    text = memory_summary(pool)
    assert "Requested bytes" in text and "1.5 KiB" in text
    assert "Reserved bytes" in text and "1 MiB" in text and "Limit: 4 MiB" in text
    assert "Fragmentation" in text
    assert "Pool(" in text
    summary_of_record = memory_summary(pool.statistics())
    assert "MemoryStatistics" in summary_of_record
    text = repr(pool)
    assert "arenas=1" in text and "requested=1.5 KiB" in text and "first_fit" in text
    with pytest.raises(InvalidArgumentError):
        memory_summary(42)


def test_size_of_and_owns() -> None:
    pool = Pool(CountingMemory())
    address = pool.allocate(777)
    assert pool.owns(address) and pool.size_of(address) == 777
    pool.deallocate(address, 777)
    assert not pool.owns(address)
    with pytest.raises(DoubleFreeError):
        pool.size_of(address)


# --- every strategy, random workloads, real bytes -------------------------------------------


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("growth", [NextPowerOfTwo(), SameAsRequested(), Doubling("64KiB")])
def test_random_workload_keeps_invariants_and_bytes(strategy: str, growth: object) -> None:
    rng = random.Random(f"{strategy}-{growth!r}")
    pool = Pool(BufferMemory(), strategy=strategy, growth=growth,  # type: ignore[arg-type]
                initial_size="16KiB", maximum_size="4MiB")
    live: dict[int, tuple[int, int]] = {}  # address -> (nbytes, fill byte)
    for step in range(400):
        if live and rng.random() < 0.45:
            address = rng.choice(list(live))
            nbytes, fill = live.pop(address)
            assert ctypes.string_at(address, nbytes) == bytes([fill]) * nbytes
            pool.deallocate(address, nbytes)
        else:
            nbytes = rng.choice([1, 100, 256, 1000, 4096, 20000, 70000])
            alignment = rng.choice([1, 8, 256, 4096])
            address = pool.allocate(nbytes, alignment)
            assert address % alignment == 0
            fill = step % 251
            ctypes.memset(address, fill, nbytes)
            live[address] = (nbytes, fill)
        if step % 20 == 0:
            pool._check_invariants()
            if rng.random() < 0.3:
                pool.trim()
    pool._check_invariants()
    for address, (nbytes, fill) in live.items():
        assert ctypes.string_at(address, nbytes) == bytes([fill]) * nbytes
    assert pool.statistics().allocations.current == len(live)


def test_pools_nest() -> None:
    outer = Pool(CountingMemory(), initial_size="1MiB")
    inner = Pool(outer, initial_size="64KiB", growth=SameAsRequested())
    address = inner.allocate(100)
    assert outer.statistics().requested_bytes.current == 64 * KiB
    inner.close()  # a live block: its arena stays until it is freed
    assert outer.statistics().requested_bytes.current == 64 * KiB
    inner.deallocate(address, 100)
    assert outer.statistics().requested_bytes.current == 0
    with pytest.raises(InvalidAddressError):
        inner.deallocate(address, 100)


class PoolMachine(RuleBasedStateMachine):
    """Random interleavings of every pool operation; all invariants checked after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.upstream = CountingMemory()
        self.pool = Pool(self.upstream, initial_size="4KiB", growth=NextPowerOfTwo(),
                         maximum_size="1MiB")
        self.live: dict[int, int] = {}

    @rule(nbytes=st.integers(1, 300_000), alignment=st.sampled_from([1, 16, 256, 4096]))
    def allocate(self, nbytes: int, alignment: int) -> None:
        before = self.pool.statistics()
        try:
            address = self.pool.allocate(nbytes, alignment)
        except OutOfMemoryError:
            assert self.pool.statistics().requested_bytes == before.requested_bytes
            return
        assert address % alignment == 0 and address not in self.live
        self.live[address] = nbytes

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def deallocate(self, data: st.DataObject) -> None:
        address = data.draw(st.sampled_from(sorted(self.live)))
        self.pool.deallocate(address, self.live.pop(address))

    @rule()
    def trim(self) -> None:
        self.pool.trim()

    @rule()
    def reset(self) -> None:
        if self.live:
            with pytest.raises(ResourceInUseError):
                self.pool.reset()
        self.pool.reset(force=True)
        self.live.clear()

    @invariant()
    def consistent(self) -> None:
        self.pool._check_invariants()
        stats = self.pool.statistics()
        assert stats.allocations.current == len(self.live)
        assert stats.requested_bytes.current == sum(self.live.values())
        assert stats.reserved_bytes.current <= 1 * MiB
        assert stats.reserved_bytes.current == sum(self.upstream.inner.live_blocks().values())


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, derandomize=True
)


def test_memory_summary_reads_any_record_by_its_fields() -> None:
    from tensorarena.stats import Count

    @dataclasses.dataclass(frozen=True)
    class Custom:
        requested_bytes: Count
        evictions: int

    record = Custom(requested_bytes=Count(3 * MiB, 4 * MiB, 9 * MiB), evictions=7)
    text = memory_summary(record, title="custom")
    assert "custom" in text and "Requested bytes" in text and "3 MiB" in text
    assert "4 MiB" in text and "9 MiB" in text and "6 MiB" in text  # total and freed
    assert "Evictions: 7" in text  # a number that is not a Count is still shown
    assert "Reserved bytes" not in text  # no field, no row


def test_at_the_limit_a_request_that_cannot_fit_gives_nothing_back() -> None:
    """Before, the pool gave its empty arenas back and then raised anyway."""
    upstream = CountingMemory()
    pool = Pool(upstream, initial_size="1MiB", growth=SameAsRequested(), maximum_size="2MiB")
    keep = pool.allocate(512 * KiB)
    spare = pool.allocate(1 * MiB)  # a second arena of 1 MiB
    pool.deallocate(spare, 1 * MiB)  # now empty: trim() could give it back
    before = pool.statistics(), arena_sizes(pool), upstream.deallocations
    with pytest.raises(OutOfMemoryError, match="maximum_size"):
        pool.allocate(1536 * KiB)  # over the cap even with the empty arena given back
    assert (pool.statistics(), arena_sizes(pool), upstream.deallocations) == (
        one_more_oom(before[0]), before[1], before[2],
    )
    pool.deallocate(keep, 512 * KiB)


class LargeRefusingMemory(CountingMemory):
    """Refuses requests of ``fail_from`` bytes or more (when set), serves the rest."""

    fail_from: int | None = None

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        self.fail = self.fail_from is not None and nbytes >= self.fail_from
        return super().allocate(nbytes, alignment, stream)


def test_at_the_limit_a_refused_retry_keeps_the_empty_arenas() -> None:
    upstream = LargeRefusingMemory()
    pool = Pool(upstream, initial_size="2KiB", growth=SameAsRequested(), maximum_size="8KiB")
    pool.allocate(2 * KiB)
    for address in [pool.allocate(3 * KiB) for _ in range(2)]:
        pool.deallocate(address, 3 * KiB)
    reserved = pool.statistics().reserved_bytes
    upstream.fail_from = 5 * KiB  # the 5 KiB arena that needs their room is refused after all
    with pytest.raises(OutOfMemoryError):
        pool.allocate(5 * KiB)
    assert sorted(arena_sizes(pool)) == [2 * KiB, 3 * KiB, 3 * KiB]  # given back and taken again
    now = pool.statistics().reserved_bytes  # (its total counts the arenas taken again)
    assert (now.current, now.peak) == (reserved.current, reserved.peak) == (8 * KiB, 8 * KiB)
    pool._check_invariants()
    upstream.fail_from = None
    pool.allocate(5 * KiB)  # and once the upstream gives, the retry goes as before
    assert arena_sizes(pool) == [2 * KiB, 5 * KiB]


def test_an_upstream_out_of_memory_retry_that_fails_keeps_the_reserve() -> None:
    from tensorarena.adaptors.limiting import Limiting

    upstream = Limiting(CountingMemory(), "8KiB")
    pool = Pool(upstream, initial_size="4KiB", growth=SameAsRequested())
    kept = pool.allocate(4 * KiB)
    pool.deallocate(pool.allocate(4 * KiB), 4 * KiB)  # a second arena, now empty: 8 KiB, exactly
    assert arena_sizes(pool) == [4 * KiB, 4 * KiB]
    with pytest.raises(OutOfMemoryError):
        pool.allocate(5 * KiB)  # 4 + 5 > 8 even with the empty arena given back
    assert arena_sizes(pool) == [4 * KiB, 4 * KiB]
    assert upstream.statistics().requested_bytes.current == 8 * KiB
    pool._check_invariants()
    block = pool.allocate(4 * KiB)  # the empty arena serves at once
    assert upstream.statistics().requested_bytes.current == 8 * KiB
    pool.deallocate(block, 4 * KiB)
    pool.deallocate(kept, 4 * KiB)
    pool.allocate(8 * KiB)  # an exact fit once both are given back
    assert arena_sizes(pool) == [8 * KiB]


def test_an_out_of_memory_the_alignment_causes_names_the_alignment() -> None:
    pool = Pool(CountingMemory(), initial_size="64KiB", maximum_size="64KiB")
    with pytest.raises(OutOfMemoryError, match="alignment 1048576 rounds the request up"):
        pool.allocate(1024, alignment=1 << 20)
    with pytest.raises(OutOfMemoryError) as info:  # an aligned request says nothing of it
        pool.allocate(1 << 20, alignment=1 << 20)
    assert "alignment" not in str(info.value)
