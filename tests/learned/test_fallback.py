"""The learned plans' fallback memory on real host memory: a region per large block, small blocks
in small arenas by class of size, every boundary of the rule, errors that change nothing."""

from __future__ import annotations

import pytest
from _memory import view

from tensorarena.adaptors.counting import Counting
from tensorarena.adaptors.limiting import Limiting
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    OutOfMemoryError,
    ResourceClosedError,
)
from tensorarena.learned.fallback import FALLBACK_CHUNK, FALLBACK_THRESHOLD, SegregatedFallback
from tensorarena.memory.host import PAGE_SIZE, HostMemory


def _fallback() -> tuple[SegregatedFallback, Counting]:
    meter = Counting(HostMemory())
    return SegregatedFallback(meter), meter


def _held(meter: Counting) -> int:
    return meter.statistics().requested_bytes.current


@pytest.mark.parametrize(("nbytes", "region"), [
    (FALLBACK_THRESHOLD, True),  # at the threshold: a region
    (FALLBACK_THRESHOLD - 1, False),  # just below, not whole pages: a small arena
    (FALLBACK_THRESHOLD + 1, True),
    (PAGE_SIZE, True),  # whole pages cost nothing to round: a region at any size
    (2 * PAGE_SIZE, True),
    (PAGE_SIZE - 1, False),
])
def test_a_large_or_page_sized_block_gets_a_region_of_its_own(nbytes: int, region: bool) -> None:
    fallback, meter = _fallback()
    address = fallback.allocate(nbytes, 64)
    view(address, nbytes)[:] = 7
    rounded = -(-nbytes // PAGE_SIZE) * PAGE_SIZE
    if region:
        assert _held(meter) == rounded == fallback.reserved_bytes  # honest: what is mapped
    else:
        assert nbytes <= _held(meter) < nbytes + FALLBACK_CHUNK
    fallback.deallocate(address, nbytes)
    if region:
        assert _held(meter) == 0  # given back with its block, no trim needed
    fallback.trim()
    assert _held(meter) == 0 and len(fallback) == 0


def test_a_large_alignment_gets_a_region_honouring_it() -> None:
    fallback, _ = _fallback()
    address = fallback.allocate(100, 2 * PAGE_SIZE)
    assert address % (2 * PAGE_SIZE) == 0
    fallback.deallocate(address, 100)


def test_a_lasting_tiny_block_pins_no_arena_made_for_a_larger_one() -> None:
    fallback, meter = _fallback()
    temporaries = [fallback.allocate(3000, 64) for _ in range(2)]
    tiny = fallback.allocate(1023, 64)  # under 1 KiB: its own class
    small = fallback.allocate(1024, 64)  # at 1 KiB: the small blocks' class
    view(tiny, 1023)[:] = 1
    view(small, 1024)[:] = 2
    for address in temporaries:
        fallback.deallocate(address, 3000)
    fallback.deallocate(small, 1024)
    fallback.trim()
    # Only the tiny block's arena stays: the first arena of a pool is the request's size.
    assert _held(meter) == 1024 and len(fallback) == 1
    assert (view(tiny, 1023) == 1).all()
    fallback.deallocate(tiny, 1023)
    fallback.trim()
    assert _held(meter) == 0


def test_small_arenas_grow_by_doubling_up_to_the_chunk() -> None:
    fallback, meter = _fallback()
    blocks = [fallback.allocate(3000, 64) for _ in range(40)]
    assert len({b for b in blocks}) == 40
    for i, address in enumerate(blocks):
        view(address, 3000)[:] = i % 251
    for i, address in enumerate(blocks):
        assert (view(address, 3000) == i % 251).all()
    # No arena is larger than a chunk (two 3000-byte blocks fill one), none is left empty.
    held, arenas = _held(meter), meter.statistics().allocations.current
    assert held <= arenas * FALLBACK_CHUNK and arenas <= 21
    for address in blocks:
        fallback.deallocate(address, 3000)
    assert fallback.trim() > 0 and _held(meter) == 0


def test_a_second_free_is_named_and_a_foreign_address_refused() -> None:
    fallback, _ = _fallback()
    large = fallback.allocate(FALLBACK_THRESHOLD, 64)
    small = fallback.allocate(100, 64)
    fallback.deallocate(large, FALLBACK_THRESHOLD)
    fallback.deallocate(small, 100)
    for address in (large, small):
        with pytest.raises(DoubleFreeError):
            fallback.size_of(address)
    with pytest.raises(InvalidAddressError):
        fallback.size_of(0x1000)
    again = fallback.allocate(100, 64)  # an address handed out again is live, not freed
    assert fallback.size_of(again) == 100
    fallback.deallocate(again, 100)


@pytest.mark.parametrize("nbytes", [FALLBACK_THRESHOLD, 100])
def test_an_upstream_refusal_changes_nothing(nbytes: int) -> None:
    fallback = SegregatedFallback(Limiting(HostMemory(), limit=100))
    with pytest.raises(OutOfMemoryError):
        fallback.allocate(nbytes, 64)
    assert len(fallback) == 0 and fallback.reserved_bytes == 0


def test_closed_it_takes_nothing_new_and_gives_back_arenas_as_they_empty() -> None:
    fallback, meter = _fallback()
    small = fallback.allocate(100, 64)
    large = fallback.allocate(FALLBACK_THRESHOLD, 64)
    fallback.close()
    with pytest.raises(ResourceClosedError):
        fallback.allocate(100, 64)
    assert len(fallback) == 2
    fallback.deallocate(small, 100)
    fallback.deallocate(large, FALLBACK_THRESHOLD)
    assert _held(meter) == 0


def test_trim_gives_back_each_arena_emptied_since_the_last_trim_and_skips_when_none_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fallback, meter = _fallback()
    first = fallback.allocate(100, 64)
    kept = fallback.allocate(2000, 64)
    fallback.deallocate(first, 100)
    assert fallback.trim() > 0 and _held(meter) > 0  # the tiny arena went; the small stays
    trims: list[object] = []
    for _, pool in fallback._classes:
        monkeypatch.setattr(pool, "trim", lambda p=pool: trims.append(p) or 0)
    assert fallback.trim() == 0 and not trims  # no small block came or went: nothing to do
    large = fallback.allocate(FALLBACK_THRESHOLD, 64)
    fallback.deallocate(large, FALLBACK_THRESHOLD)  # regions go back at once: still nothing
    assert fallback.trim() == 0 and not trims
    monkeypatch.undo()
    fallback.deallocate(kept, 2000)
    assert fallback.trim() > 0 and _held(meter) == 0


@pytest.mark.parametrize("option", ["threshold", "chunk", "granularity"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "8KiB"])
def test_a_bad_option_is_refused(option: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=option):
        SegregatedFallback(HostMemory(), **{option: value})  # type: ignore[arg-type]
