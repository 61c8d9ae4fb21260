"""An ``Arena`` remembers the addresses of its last ``RECENT_FREES`` frees, and no more.

A double free among them is a :class:`DoubleFreeError`; an address freed longer ago is refused as
not live (an :class:`InvalidAddressError`, as for an address never allocated), and the record
takes the same memory however many addresses were ever freed. Every refused call leaves the
arena as it was.
"""

from __future__ import annotations

import tracemalloc

import pytest

from tensorarena.core import STRATEGIES, Arena
from tensorarena.core.arena import RECENT_FREES
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
