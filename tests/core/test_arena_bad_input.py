"""Bad input to an ``Arena`` raises the specific error and leaves the arena exactly as it was.

Each test builds an arena with a few live blocks and a freed one, takes a snapshot (live blocks,
statistics, the strategy's free extents), makes the bad call, and compares.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tensorarena.core import DEFAULT_STRATEGY, STRATEGIES, Arena, SegregatedFit
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidSizeError,
    OutOfMemoryError,
    SizeMismatchError,
    TensorArenaError,
    UnknownNameError,
)
from tensorarena.stats import Count

K = 1024


@pytest.fixture(params=list(STRATEGIES))
def arena(request: pytest.FixtureRequest) -> Arena:
    arena = Arena("1MiB", request.param)
    for nbytes in (1000, 4 * K, 300, 64 * K):
        arena.allocate(nbytes)
    arena.deallocate(arena.allocate(2 * K))
    return arena


def snapshot(arena: Arena) -> tuple[object, ...]:
    """Everything observable, except the count of refused requests (which only ever grows)."""
    stats = dataclasses.replace(arena.statistics(), num_ooms=0)
    return arena.live_blocks(), stats, arena.free_extents(), repr(arena)


@pytest.mark.parametrize(
    "nbytes", [0, -1, -(1 << 70), 2**61, 1.5, 1000.0, True, None, "abc", "-5", "0", "1.5B", [8]]
)
def test_bad_sizes_raise_invalid_size_and_change_nothing(arena: Arena, nbytes: object) -> None:
    before = snapshot(arena)
    with pytest.raises(InvalidSizeError):
        arena.allocate(nbytes)  # type: ignore[arg-type]
    assert snapshot(arena) == before


@pytest.mark.parametrize("alignment", [0, -256, 3, 384, 1.0, 256.0, "256", None, True, 1 << 61])
def test_bad_alignments_raise_and_change_nothing(arena: Arena, alignment: object) -> None:
    before = snapshot(arena)
    with pytest.raises(InvalidAlignmentError):
        arena.allocate(256, alignment)  # type: ignore[arg-type]
    assert snapshot(arena) == before


def test_alignment_above_the_base_alignment_is_refused() -> None:
    arena = Arena(1 << 20, base=0x10000)
    assert arena.allocate(100, 1 << 16) % (1 << 16) == 0
    before = snapshot(arena)
    with pytest.raises(InvalidAlignmentError, match="base"):
        arena.allocate(100, 1 << 17)
    assert snapshot(arena) == before


def test_sizes_accept_strings_and_integer_like_values(arena: Arena) -> None:
    address = arena.allocate("8KiB")
    assert arena.size_of(address) == 8 * K
    arena.deallocate(address, "8KiB")
    address = arena.allocate(np.int64(5000), np.int64(512))
    assert address % 512 == 0 and arena.size_of(address) == 5000
    arena.deallocate(address, np.int64(5000))


def test_double_free_raises_and_changes_nothing(arena: Arena) -> None:
    address = arena.allocate(K)
    arena.deallocate(address)
    before = snapshot(arena)
    with pytest.raises(DoubleFreeError, match="double free"):
        arena.deallocate(address)
    assert snapshot(arena) == before


def test_free_after_reset_is_a_double_free(arena: Arena) -> None:
    addresses = list(arena.live_blocks())
    arena.reset()
    before = snapshot(arena)
    for address in addresses:
        with pytest.raises(DoubleFreeError):
            arena.deallocate(address)
    assert snapshot(arena) == before
    assert arena.statistics().free_bytes == arena.free_bytes()


@pytest.mark.parametrize("address", [12345, 1 << 40, -1, 3.5, "0x100", None, [1]])
def test_never_allocated_addresses_raise(arena: Arena, address: object) -> None:
    before = snapshot(arena)
    with pytest.raises(InvalidAddressError) as info:
        arena.deallocate(address)  # type: ignore[arg-type]
    assert type(info.value) is InvalidAddressError  # not a double free
    assert snapshot(arena) == before


@pytest.mark.parametrize("wrong", [999, 1001, 1024, "1KiB", np.int64(999)])
def test_size_mismatch_on_free_raises_and_changes_nothing(arena: Arena, wrong: object) -> None:
    address = next(a for a, n in arena.live_blocks().items() if n == 1000)
    before = snapshot(arena)
    with pytest.raises(SizeMismatchError) as info:
        arena.deallocate(address, wrong)  # type: ignore[arg-type]
    assert info.value.allocated == 1000 and info.value.address == address
    assert type(info.value.given) is int and info.value.given == int(str(wrong).rstrip("KiB")) * (
        1024 if wrong == "1KiB" else 1
    )
    assert snapshot(arena) == before
    arena.deallocate(address, 1000)  # the block is still live and frees normally


@pytest.mark.parametrize("wrong", [0, -1000, "1000B5", 1000.5, 1000.0, True, [1000]])
def test_bad_sizes_on_free_raise_invalid_size_and_change_nothing(
    arena: Arena, wrong: object
) -> None:
    address = next(a for a, n in arena.live_blocks().items() if n == 1000)
    before = snapshot(arena)
    with pytest.raises(InvalidSizeError):
        arena.deallocate(address, wrong)  # type: ignore[arg-type]
    assert snapshot(arena) == before
    arena.deallocate(address, 1000)  # the block is still live and frees normally


def test_every_error_is_a_tensorarena_error(arena: Arena) -> None:
    with pytest.raises(TensorArenaError):
        arena.allocate(0)
    with pytest.raises(ValueError):  # and the built-in type callers already catch
        arena.allocate(256, 3)
    with pytest.raises(MemoryError):
        arena.allocate("1GiB")


# --- out of memory --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_out_of_memory_by_exhaustion(name: str) -> None:
    arena = Arena(64 * K, name)
    arena.allocate(48 * K)
    before = snapshot(arena)
    with pytest.raises(OutOfMemoryError) as info:
        arena.allocate(32 * K)
    error = info.value
    assert not error.is_fragmentation
    assert error.requested == 32 * K and error.capacity == 64 * K
    assert error.free == arena.free_bytes() < 32 * K
    assert "exhaustion" in str(error) and "32 KiB" in str(error)
    assert snapshot(arena) == before
    assert arena.statistics().num_ooms == 1


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_out_of_memory_by_fragmentation(name: str) -> None:
    arena = Arena(64 * K, name)
    blocks = [arena.allocate(4 * K) for _ in range(16)]
    for address in blocks[::2]:
        arena.deallocate(address)
    before = snapshot(arena)
    with pytest.raises(OutOfMemoryError) as info:
        arena.allocate(8 * K)
    error = info.value
    assert error.is_fragmentation
    assert error.free == 32 * K and error.largest_free == 4 * K
    assert "fragmentation" in str(error)
    assert snapshot(arena) == before
    assert arena.statistics().fragmentation == pytest.approx(1 - 4 / 32)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_request_larger_than_the_region(name: str) -> None:
    arena = Arena(64 * K, name)
    with pytest.raises(OutOfMemoryError, match="exhaustion"):
        arena.allocate(1 << 40)
    assert arena.statistics().free_extents >= 1


def test_out_of_memory_explains_an_alignment_that_no_extent_can_meet() -> None:
    arena = Arena(8 * K + 256, "first_fit", base=1 << 20)
    arena.allocate(256)
    with pytest.raises(OutOfMemoryError, match="alignment 8192") as info:
        arena.allocate(256, 8 * K)  # 8 KiB free, but its only 8 KiB-aligned byte is taken
    assert info.value.largest_free == 8 * K


# --- the arena itself -----------------------------------------------------------------------


def test_default_strategy_is_best_fit() -> None:
    assert DEFAULT_STRATEGY == "best_fit"
    assert Arena(K).strategy_name == "best_fit"


def test_unknown_strategy_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="best_fit"):
        Arena(K, "worst_fit")
    with pytest.raises(InvalidArgumentError, match="a name or a callable"):
        Arena(K, 42)  # type: ignore[arg-type]


def test_statistics_are_frozen_and_count_correctly() -> None:
    arena = Arena("1MiB", "tlsf")
    a = arena.allocate(1000)
    b = arena.allocate(3000, 1024)
    arena.deallocate(a)
    stats = arena.statistics()
    assert stats.requested_bytes == Count(current=3000, peak=4000, total=4000)
    assert stats.allocated_bytes == 3072  # what the strategy holds: the request rounded
    assert stats.allocations == Count(current=1, peak=1, total=2)
    assert stats.capacity == 1 << 20
    assert stats.free_bytes == (1 << 20) - 3072
    assert stats.inactive_split_bytes == stats.free_bytes  # a block is live: not returnable
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.free_bytes = 0  # type: ignore[misc]
    arena.reset()
    stats = arena.statistics()
    assert stats.requested_bytes.current == 0 and stats.allocations.freed == 2
    assert stats.free_extents == 1 and stats.inactive_split_bytes == 0
    assert not arena.is_live(b) and len(arena) == 0


def test_repr_shows_live_state() -> None:
    arena = Arena("1MiB", "buddy", base=0x1000)
    arena.allocate(3000)
    text = repr(arena)
    assert "buddy" in text and "1 MiB" in text and "live=1" in text and "0x1000" in text


def test_addresses_start_at_base() -> None:
    arena = Arena(1 << 20, "first_fit", base=0x7F00_0000_0000)
    address = arena.allocate(100)
    assert address == 0x7F00_0000_0000 and arena.owns(address)
    assert not arena.owns(address + (1 << 20))
    arena.deallocate(address)


class _CountingChecks:
    """A segregated-fit strategy that counts ``free_extents`` calls: only the expensive
    invariant check makes them. (Composition, not a patched method: a compiled ``Arena``'s
    methods cannot be replaced on an instance.)"""

    name = "counting"
    coalesces = True

    def __init__(self, capacity: int) -> None:
        self._inner = SegregatedFit(capacity)
        self.capacity = capacity
        self.reserve = self._inner.reserve
        self.release = self._inner.release
        self.reset = self._inner.reset
        self.free_bytes = self._inner.free_bytes
        self.largest_free = self._inner.largest_free
        self.free_extent_count = self._inner.free_extent_count
        self.checks = 0

    def free_extents(self) -> list[tuple[int, int]]:
        self.checks += 1
        return self._inner.free_extents()


def test_debug_mode_checks_invariants_after_every_call() -> None:
    strategies: list[_CountingChecks] = []

    def factory(capacity: int) -> _CountingChecks:
        strategies.append(_CountingChecks(capacity))
        return strategies[-1]

    arena = Arena(64 * K, factory, debug=True)
    arena.deallocate(arena.allocate(100))
    assert strategies[0].checks == 2
    quiet = Arena(64 * K, factory, debug=False)
    quiet.deallocate(quiet.allocate(100))
    assert strategies[1].checks == 0


@pytest.mark.parametrize("capacity", [0, -1, "lots", 2.5])
def test_bad_capacity(capacity: object) -> None:
    with pytest.raises(InvalidSizeError):
        Arena(capacity)  # type: ignore[arg-type]


def test_a_base_below_the_default_alignment_still_validates_every_alignment() -> None:
    arena = Arena(1 << 16, base=0x80)
    with pytest.raises(InvalidAlignmentError):
        arena.allocate(64)  # the default 256 cannot be honoured at base 0x80
    for bad in (-1, 0, 3, 256):
        with pytest.raises(InvalidAlignmentError):
            arena.allocate(64, bad)
    assert arena.allocate(64, 128) == 0x80


def test_peak_is_exact_before_any_free_and_survives_reset() -> None:
    # The arena folds the peak in lazily (when allocated decreases); every reading must agree.
    arena = Arena("1MiB", "segregated_fit")
    a = arena.allocate(1000)
    arena.allocate(2000, 64)
    assert arena.statistics().requested_bytes.peak == 3000
    arena.deallocate(a)
    arena.allocate(500)
    assert arena.statistics().requested_bytes.peak == 3000
    arena.allocate(5000)
    assert arena.statistics().requested_bytes.peak == 7500
    arena.reset()
    stats = arena.statistics()
    assert stats.requested_bytes == Count(current=0, peak=7500, total=8500)
    assert stats.allocations.total == 4
    arena.reset_peak_stats()
    assert arena.statistics().requested_bytes.peak == 0


def test_blocks_of_mixed_alignments_free_by_their_own_reserved_size() -> None:
    arena = Arena("1MiB", "first_fit")
    small = arena.allocate(100, 4)  # reserved 100, not the default rounding to 256
    default = arena.allocate(100)
    assert default == 256 and arena.statistics().allocated_bytes == 356
    assert arena.size_of(small) == 100 and arena.live_blocks() == {0: 100, 256: 100}
    arena.deallocate(small, 100)
    arena.deallocate(default, 100)
    assert arena.free_extents() == [(0, 1 << 20)]


def test_out_of_memory_caused_by_alignment_says_so() -> None:
    arena = Arena(1024, "first_fit")
    arena.allocate(512, 1)
    arena.allocate(200, 1)  # 312 bytes free in one extent
    with pytest.raises(OutOfMemoryError, match="alignment 256 rounds the request up to 512"):
        arena.allocate(300)  # 300 bytes would fit; rounded to the default 256 they do not
