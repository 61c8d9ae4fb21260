"""First and next fit find the right extent however many small extents come first.

The pure build scans a byte per extent, the compiled build walks the sizes (see
``core/_address_ordered.py``); these cases put the answer a few, hundreds and thousands of
extents into the search (``_WALK`` was where an earlier compiled build switched from one to the
other). The compiled build starts first fit's walk at a floor per size class (in its packed
extents, ``core/_packed_first_fit.py``); the floors' own invariant is checked here too.
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

from tensorarena.core._bisect import COMPILED
from tensorarena.core.first_fit import FirstFit
from tensorarena.core.next_fit import NextFit

_WALK = 512


@pytest.mark.parametrize("holes_below", [0, 3, _WALK - 1, _WALK, _WALK + 1, 3 * _WALK])
def test_lowest_fitting_extent_beyond_many_small_holes(holes_below: int) -> None:
    blocks = 6 * _WALK + 8  # room for the most holes and the larger extent above them
    strategy = FirstFit(blocks * 1024)
    offsets = [strategy.reserve(1024, 256) for _ in range(blocks)]
    assert offsets == [i * 1024 for i in range(blocks)]
    # Free extents of 1 KiB (every other block), then one of 3 KiB right after them.
    for i in range(0, 2 * holes_below, 2):
        strategy.release(i * 1024, 1024)
    big = 2 * holes_below + 1
    for i in range(big, big + 3):
        strategy.release(i * 1024, 1024)
    assert strategy.free_extent_count() == holes_below + 1
    assert strategy.reserve(2048, 256) == big * 1024
    # Nothing holds 8 KiB (every block above is live); 1 KiB goes to the lowest hole.
    assert strategy.reserve(8192, 256) is None
    assert strategy.reserve(1024, 256) == (0 if holes_below else (big + 2) * 1024)


def test_a_request_larger_than_any_power_of_two_class_is_refused() -> None:
    strategy = FirstFit(1 << 20)
    assert strategy.reserve(1 << 70, 256) is None


@pytest.mark.parametrize("holes_above", [0, _WALK - 1, _WALK, 3 * _WALK])
def test_next_fit_passes_small_holes_above_the_rover(holes_above: int) -> None:
    blocks = 2 * holes_above + 8
    strategy = NextFit(blocks * 1024)
    assert [strategy.reserve(1024, 256) for _ in range(blocks)] == [i * 1024 for i in range(blocks)]
    for i in range(2, 2 * holes_above + 2, 2):
        strategy.release(i * 1024, 1024)
    big = 2 * holes_above + 3
    for i in range(big, big + 3):
        strategy.release(i * 1024, 1024)
    strategy.release(0, 1024)  # below the rover's start: taken only after wrapping
    strategy.reserve(1024, 256)  # the lowest hole at or above offset 0: moves the rover to 1 KiB
    assert strategy.rover == 1024
    assert strategy.reserve(2048, 256) == big * 1024
    assert strategy.rover == (big + 2) * 1024


def test_next_fit_places_aligned_inside_a_misaligned_extent_at_the_rover() -> None:
    strategy = NextFit(64 * 1024)
    # The rest, [1 KiB, 64 KiB), is large enough but does not start aligned to 4 KiB.
    assert strategy.reserve(1024, 256) == 0
    assert strategy.reserve(4096, 4096) == 4096
    assert strategy.rover == 8192


def _floors(strategy: FirstFit | NextFit) -> list[int]:
    """First fit's floors (compiled: in its packed extents); none for next fit."""
    packed = strategy._packed
    return [] if packed is None else packed.floors()


def _check_floors(strategy: FirstFit | NextFit) -> None:
    floors = _floors(strategy)
    if not floors:  # next fit keeps none
        return
    assert all(a <= b for a, b in pairwise(floors)), floors
    for offset, size in strategy.free_extents():
        # No free extent of bit length c or more starts below floors[c].
        assert all(floors[c] <= offset for c in range(1, size.bit_length() + 1)), (offset, size)


@pytest.mark.skipif(not COMPILED, reason="only the compiled build keeps floors")
@pytest.mark.parametrize("cls", [FirstFit, NextFit])
def test_floors_stay_lower_bounds_of_each_size_class(cls: type[FirstFit | NextFit]) -> None:
    rng = random.Random(13)
    capacity = 1 << 22
    strategy = cls(capacity)
    live: list[tuple[int, int]] = []
    raised = False
    for step in range(4000):
        if live and (rng.random() < 0.45 or step % 500 > 450):
            offset, nbytes = live.pop(rng.randrange(len(live)))
            strategy.release(offset, nbytes)
        else:
            nbytes = 256 << rng.randrange(12) if rng.random() < 0.8 else rng.randrange(1, 5000)
            placed = strategy.reserve(nbytes, 1 << rng.randrange(13))
            if placed is not None:
                live.append((placed, nbytes))
        _check_floors(strategy)
        raised = raised or any(_floors(strategy)[1:])
    # First fit's searches raise floors; next fit keeps none.
    assert raised is (cls is FirstFit)
    assert bool(_floors(strategy)) is (cls is FirstFit)
    for offset, nbytes in live:
        strategy.release(offset, nbytes)
    _check_floors(strategy)
    assert strategy.free_extents() == [(0, capacity)]


@pytest.mark.skipif(not COMPILED, reason="only the compiled build keeps floors")
def test_a_search_that_finds_nothing_raises_the_floor_past_every_extent() -> None:
    strategy = FirstFit(1 << 20)
    assert strategy.reserve(1 << 19, 256) == 0
    assert strategy.reserve(1 << 19, 256) is not None  # now full
    assert strategy.reserve(1 << 19, 256) is None
    assert _floors(strategy)[20] == (1 << 20) + 1  # the sentinel's start: nothing of that class
    strategy.release(0, 1 << 19)
    assert strategy.reserve(1 << 19, 256) == 0  # the release lowered it again
