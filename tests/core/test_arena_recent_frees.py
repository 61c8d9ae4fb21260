"""An ``Arena`` remembers the addresses of its last ``recent_frees`` frees, and no more.

``recent_frees`` is ``RECENT_FREES`` for an arena of 1 MiB or more, fewer for a smaller one (as
many as it can hold blocks of the default alignment, 16 at least).

A double free among them is a :class:`DoubleFreeError`; an address freed longer ago is refused as
not live (an :class:`InvalidAddressError`, as for an address never allocated), and the record
takes the same memory however many addresses were ever freed. Every refused call leaves the
arena as it was.
"""

from __future__ import annotations

import tracemalloc

import pytest

from tensorarena.core import STRATEGIES, Arena
from tensorarena.core.arena import RECENT_FREES, recent_frees_length
from tensorarena.errors import DoubleFreeError, InvalidAddressError

K = 1024


def snapshot(arena: Arena) -> tuple[object, ...]:
    return arena.live_blocks(), arena.statistics(), arena.free_extents(), repr(arena)


def test_the_record_of_freed_addresses_stays_bounded() -> None:
    # Next fit's rover moves on, so every cycle frees an address never freed before: keeping
    # them all would grow by one entry (~70 bytes) per free.
    tracemalloc.start()
    try:
        arena = Arena("64MiB", "next_fit")
        held = arena.allocate(256)

        def cycle(times: int) -> None:
            nonlocal held
            for _ in range(times):
                new = arena.allocate(256)
                arena.deallocate(held)
                held = new

        cycle(2 * RECENT_FREES)  # the record is full
        before = tracemalloc.get_traced_memory()[0]
        cycle(8 * RECENT_FREES)
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held >= 10 * RECENT_FREES * 256, "the cycles did not use a new address each"
    assert growth < 64 * K, f"{growth} bytes more after {8 * RECENT_FREES} frees"


def _free_then_others(name: str, others: int) -> tuple[Arena, int]:
    """An arena where the block at the returned address was freed, then ``others`` blocks."""
    arena = Arena("1MiB", name)
    arena.allocate(K)
    freed = arena.allocate(K)
    arena.allocate(K)
    arena.deallocate(freed)
    for _ in range(others):
        # Larger than the hole the freed block left, so its address is not handed out again.
        address = arena.allocate(4 * K)
        assert address != freed
        arena.deallocate(address)
    return arena, freed


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_double_free_among_the_last_frees_is_named(name: str) -> None:
    arena, freed = _free_then_others(name, RECENT_FREES - 1)
    before = snapshot(arena)
    with pytest.raises(DoubleFreeError, match="double free"):
        arena.deallocate(freed)
    assert snapshot(arena) == before


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_an_address_freed_before_the_last_frees_is_refused_as_not_live(name: str) -> None:
    arena, freed = _free_then_others(name, RECENT_FREES)
    before = snapshot(arena)
    for call in (arena.deallocate, arena.size_of):
        with pytest.raises(InvalidAddressError, match="is not live") as info:
            call(freed)
        assert type(info.value) is InvalidAddressError  # no longer known as a double free
        assert "freed long ago" in str(info.value) and info.value.address == freed
    assert not arena.is_live(freed)
    assert snapshot(arena) == before


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_an_address_handed_out_again_is_live_until_freed_again(name: str) -> None:
    arena = Arena("1MiB", name)
    first = arena.allocate(K)
    arena.deallocate(first)
    again = [arena.allocate(K) for _ in range(4)]
    assert first in again  # every strategy reuses the space within a few requests
    arena.deallocate(first)
    with pytest.raises(DoubleFreeError):
        arena.deallocate(first)


def test_reset_counts_as_freeing_every_live_block() -> None:
    arena = Arena("1MiB")
    addresses = [arena.allocate(K) for _ in range(8)]
    arena.reset()
    for _ in range(RECENT_FREES - len(addresses)):
        assert arena.allocate(K) == addresses[0]  # the only address handed out again
        arena.deallocate(addresses[0])
    for address in addresses:
        with pytest.raises(DoubleFreeError):
            arena.deallocate(address)
    for _ in range(len(addresses)):
        arena.deallocate(arena.allocate(K))
    for address in addresses[1:]:  # released by reset() more than RECENT_FREES frees ago
        with pytest.raises(InvalidAddressError) as info:
            arena.deallocate(address)
        assert type(info.value) is InvalidAddressError


# --- the ring's length is the arena's own -------------------------------------------------------


@pytest.mark.parametrize(
    ("capacity", "length"),
    [
        (256, 16),
        (4 * K, 16),
        (4 * K + 256, 32),
        (8 * K, 32),
        (264 * K, 2048),
        (1024 * K, RECENT_FREES),
        (64 * 1024 * K, RECENT_FREES),
    ],
)
def test_an_arena_remembers_as_many_frees_as_it_can_hold_blocks(capacity: int, length: int) -> None:
    # The blocks of the default alignment it can hold at once (capacity // 256), rounded up to
    # a power of two, 16 at least, RECENT_FREES at most.
    assert recent_frees_length(capacity) == length
    assert Arena(capacity).recent_frees == length


def test_a_small_arena_keeps_a_small_record_however_many_frees() -> None:
    # A 4 KiB arena holds 16 blocks of 256 bytes: its record is full after 16 frees. A record of
    # the last 4096 frees goes on growing to 4096 slots and the addresses they keep (146 kB).
    arena = Arena("4KiB", "next_fit")
    held = arena.allocate(256)
    addresses = {held}

    def cycle(times: int) -> None:
        nonlocal held
        for _ in range(times):  # next fit's rover moves on: each free is another address
            new = arena.allocate(256)
            arena.deallocate(held)
            held = new
            addresses.add(held)

    tracemalloc.start()
    try:
        cycle(32)
        before = tracemalloc.get_traced_memory()[0]
        cycle(4 * RECENT_FREES)
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(addresses) == 16  # the rover went round every slot
    assert growth < K, f"a 4 KiB arena took {growth} bytes more over {4 * RECENT_FREES} frees"


def _small_arena_free_then_others(name: str, others: int) -> tuple[Arena, int]:
    """A 4 KiB arena where the block at the returned address was freed, then ``others``."""
    arena = Arena("4KiB", name)
    arena.allocate(256)
    freed = arena.allocate(256)
    arena.allocate(256)
    arena.deallocate(freed)
    for _ in range(others):
        address = arena.allocate(1024)  # larger than the hole: the freed address stays free
        assert address != freed
        arena.deallocate(address)
    return arena, freed


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_small_arena_names_a_double_free_among_its_last_frees_only(name: str) -> None:
    length = Arena("4KiB", name).recent_frees
    assert length == 16
    arena, freed = _small_arena_free_then_others(name, length - 1)
    before = snapshot(arena)
    with pytest.raises(DoubleFreeError, match="double free"):
        arena.deallocate(freed)
    assert snapshot(arena) == before

    arena, freed = _small_arena_free_then_others(name, length)
    before = snapshot(arena)
    for call in (arena.deallocate, arena.size_of):
        with pytest.raises(InvalidAddressError, match="before the last 16 frees") as info:
            call(freed)
        assert type(info.value) is InvalidAddressError and info.value.address == freed
    assert not arena.is_live(freed)
    assert snapshot(arena) == before
