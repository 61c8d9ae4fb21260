"""What makes each placement strategy itself: where it puts a block, and how it splits and merges.

Every test places blocks through the strategy directly (offsets from 0, sizes multiples of the
alignment, as the arena guarantees) so the expected offsets can be written down.
"""

from __future__ import annotations

import pytest

from tensorarena.core import TLSF, BestFit, Buddy, FirstFit, NextFit, SegregatedFit
from tensorarena.core._bisect import COMPILED
from tensorarena.core._segregated import floor_of_class
from tensorarena.core.segregated_fit import class_floor, size_class
from tensorarena.core.tlsf import SL_BITS, mapping_insert, mapping_search
from tensorarena.errors import InvalidSizeError

K = 1024


def holes(strategy, sizes: list[int], free: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """Reserve ``sizes`` back to back from 0, then release the ones at indices ``free``."""
    offsets = [strategy.reserve(size, 256) for size in sizes]
    for i in free:
        strategy.release(offsets[i], sizes[i])
    return offsets


# --- first fit ------------------------------------------------------------------------------


def test_first_fit_takes_the_lowest_hole_that_fits() -> None:
    ff = FirstFit(64 * K)
    offsets = holes(ff, [K, 4 * K, K, 2 * K, K], free=[1, 3])
    # Holes: 4 KiB at 1 KiB and 2 KiB at 6 KiB; 2 KiB fits both: first fit takes the lower one.
    assert ff.reserve(2 * K, 256) == offsets[1]
    assert ff.free_extents() == [(3 * K, 2 * K), (6 * K, 2 * K), (9 * K, 55 * K)]


def test_first_fit_splits_for_alignment_and_keeps_the_gap_free() -> None:
    ff = FirstFit(64 * K)
    assert ff.reserve(256, 256) == 0
    assert ff.reserve(4 * K, 4 * K) == 4 * K
    assert ff.free_extents() == [(256, 4 * K - 256), (8 * K, 56 * K)]
    ff.release(4 * K, 4 * K)
    ff.release(0, 256)
    assert ff.free_extents() == [(0, 64 * K)]


def test_first_fit_refuses_what_no_extent_holds() -> None:
    ff = FirstFit(8 * K)
    holes(ff, [2 * K, 2 * K, 2 * K, 2 * K], free=[0, 2])
    assert ff.free_bytes() == 4 * K and ff.largest_free() == 2 * K
    before = ff.free_extents()
    assert ff.reserve(3 * K, 256) is None
    assert ff.free_extents() == before


# --- next fit -------------------------------------------------------------------------------


def test_next_fit_resumes_after_the_last_placement() -> None:
    nf = NextFit(64 * K)
    offsets = holes(nf, [K, K, K], free=[0])
    assert nf.rover == 3 * K
    # A hole of 1 KiB waits at 0, but the search starts at the rover.
    assert nf.reserve(K, 256) == 3 * K
    assert nf.reserve(K, 256) == 4 * K
    assert offsets[0] == 0 and nf.free_extents()[0] == (0, K)


def test_next_fit_wraps_around_when_the_top_is_full() -> None:
    nf = NextFit(4 * K)
    holes(nf, [K, K, K, K], free=[1])
    assert nf.rover == 4 * K
    assert nf.reserve(K, 256) == K  # wrapped to the only hole
    assert nf.reserve(256, 256) is None


def test_next_fit_starts_inside_a_hole_that_grew_around_the_rover() -> None:
    nf = NextFit(16 * K)
    offsets = holes(nf, [K, K, K], free=[])
    nf.release(offsets[2], K)  # the rover (3 KiB) is now inside the free extent [2 KiB, 16 KiB)
    assert nf.reserve(K, 256) == 2 * K


# --- best fit -------------------------------------------------------------------------------


def test_best_fit_takes_the_smallest_hole_that_fits() -> None:
    bf = BestFit(64 * K)
    offsets = holes(bf, [4 * K, K, 2 * K, K, 3 * K, K], free=[0, 2, 4])
    # Holes of 4, 2 and 3 KiB: 2 KiB is the tightest for a 2 KiB request, 3 KiB for 2.5 KiB.
    assert bf.reserve(2 * K, 256) == offsets[2]
    assert bf.reserve(2 * K + 512, 256) == offsets[4]
    assert bf.reserve(4 * K, 256) == offsets[0]


def test_best_fit_breaks_ties_by_lowest_address() -> None:
    bf = BestFit(64 * K)
    offsets = holes(bf, [K, K, K, K, K], free=[3, 1])
    assert bf.reserve(K, 256) == offsets[1]
    assert bf.reserve(K, 256) == offsets[3]


def test_best_fit_honours_alignment_by_looking_further() -> None:
    bf = BestFit(64 * K)
    holes(bf, [256, 2 * K, 2 * K], free=[1])  # a 2 KiB hole at 256: no 2 KiB-aligned 2 KiB in it
    # The hole [256, 2304) is large enough but holds no aligned 2 KiB; the tail at 4352 does.
    assert bf.reserve(2 * K, 2 * K) == 6 * K
    assert bf.free_extents() == [(256, 2 * K), (4 * K + 256, 1792), (8 * K, 56 * K)]


def test_best_fit_merges_both_neighbours() -> None:
    bf = BestFit(16 * K)
    offsets = holes(bf, [K, K, K, K], free=[0, 2])
    bf.release(offsets[1], K)
    assert bf.free_extents() == [(0, 3 * K), (4 * K, 12 * K)]
    bf.release(offsets[3], K)
    assert bf.free_extents() == [(0, 16 * K)] and bf.largest_free() == 16 * K


# --- segregated fit -------------------------------------------------------------------------


def test_size_classes_are_four_per_power_of_two() -> None:
    floors = [class_floor(c) for c in range(size_class(8), size_class(64) + 1)]
    assert floors == [8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64]
    for n in [1, 7, 8, 9, 1000, 1024, 1279, 1280, 3 << 40]:
        cls = size_class(n)
        assert class_floor(cls) <= n < class_floor(cls + 1)


def test_segregated_fit_takes_the_lowest_class_that_surely_fits() -> None:
    sf = SegregatedFit(1 << 20)
    offsets = holes(sf, [1280, 256, 1536, 256, 5 * K, 256], free=[0, 2, 4])
    # 1100 rounds up to the 1280 class: the 1280 hole is taken, not the larger ones.
    assert sf.reserve(1024 + 256, 256) == offsets[0]
    assert sf.reserve(1100, 4) == offsets[2]


def test_segregated_fit_falls_back_to_larger_classes() -> None:
    sf = SegregatedFit(1 << 20)
    offsets = holes(sf, [1024, 256], free=[0])
    # Only the 1 KiB hole and the big tail are free; 512 B has no class of its own: the next
    # non-empty class up serves it, and the remainder is binned by its own size.
    assert sf.reserve(512, 256) == offsets[0]
    assert sorted(sf.free_extents()) == [(512, 512), (1280, (1 << 20) - 1280)]


def test_segregated_fit_scans_its_own_class_when_nothing_larger_is_left() -> None:
    sf = SegregatedFit(8 * K)
    assert [sf.reserve(n, 4) for n in (1100, 256, 8 * K - 1356)] == [0, 1100, 1356]
    sf.release(0, 1100)
    # 1100 is not a class floor: the class above is empty, so the slow path finds the exact hole.
    assert sf.reserve(1100, 4) == 0
    assert sf.free_bytes() == 0 and sf.reserve(4, 4) is None


def test_segregated_fit_coalesces_on_release() -> None:
    sf = SegregatedFit(64 * K)
    offsets = holes(sf, [K, K, K], free=[0, 2])
    assert sf.free_extent_count() == 2
    sf.release(offsets[1], K)
    assert sf.free_extents() == [(0, 64 * K)]


# --- buddy ----------------------------------------------------------------------------------


def test_buddy_rounds_up_to_powers_of_two() -> None:
    buddy = Buddy(1 << 20)
    assert buddy.block_size(3000) == 4096 and buddy.block_size(1) == 256
    assert buddy.reserve(3000, 8) == 0
    assert buddy.free_bytes() == (1 << 20) - 4096
    assert buddy.reserve(256, 256) == 4096  # the buddy of the first 4 KiB split down


def test_buddy_splits_down_and_merges_back() -> None:
    buddy = Buddy(1 << 20)
    assert buddy.reserve(256, 256) == 0
    # One free block of every order from 256 B to 512 KiB: the halves split off.
    assert buddy.free_extents() == [(1 << k, 1 << k) for k in range(8, 20)]
    buddy.release(0, 256)
    assert buddy.free_extents() == [(0, 1 << 20)]


def test_buddy_merges_only_buddies() -> None:
    buddy = Buddy(4 * K)
    a, b, c, d = (buddy.reserve(K, 256) for _ in range(4))
    assert (a, b, c, d) == (0, K, 2 * K, 3 * K)
    buddy.release(b, K)
    buddy.release(c, K)  # b and c are neighbours but not buddies: they stay two blocks
    assert buddy.free_extents() == [(K, K), (2 * K, K)]
    buddy.release(a, K)
    assert buddy.free_extents() == [(0, 2 * K), (2 * K, K)]
    buddy.release(d, K)
    assert buddy.free_extents() == [(0, 4 * K)]


def test_buddy_covers_a_region_that_is_not_a_power_of_two() -> None:
    buddy = Buddy((3 << 20) + 300)
    assert buddy.initial_extents() == [(0, 2 << 20), (2 << 20, 1 << 20), (3 << 20, 256)]
    assert buddy.free_bytes() == (3 << 20) + 256  # the last 44 bytes hold no block
    assert buddy.largest_free() == 2 << 20
    offset = buddy.reserve(1 << 20, 256)
    assert offset == 2 << 20  # the 1 MiB top block fits exactly: no split of the 2 MiB one
    buddy.release(offset, 1 << 20)
    assert buddy.free_extents() == buddy.initial_extents()


def test_buddy_min_block_must_be_a_power_of_two() -> None:
    assert Buddy(1 << 16, min_block=64).reserve(1, 1) == 0
    with pytest.raises(ValueError, match="power of two"):
        Buddy(1 << 16, min_block=100)


# --- TLSF -----------------------------------------------------------------------------------


def test_tlsf_mapping() -> None:
    assert mapping_insert(15) == (0, 15)
    assert mapping_insert(16) == (1, 0)
    assert mapping_insert(1024) == (7, 0)
    assert mapping_insert(1024 + 64) == (7, 1)
    assert mapping_search(1024) == (7, 0)  # a class floor needs no rounding
    assert mapping_search(1025) == (7, 1)  # anything above it rounds up to the next class
    for n in (17, 100, 1000, 4097, 123_456_789):
        fl, sl = mapping_search(n)
        # Every extent in the searched class is at least n bytes: its floor is >= n.
        floor = sl if fl == 0 else ((1 << SL_BITS) + sl) << (fl - 1)
        assert floor >= n and mapping_insert(floor) == (fl, sl)


def test_tlsf_finds_a_fit_in_a_constant_number_of_classes() -> None:
    tlsf = TLSF(64 << 20)
    # Hundreds of free extents spread over many small classes, one large extent at the top.
    sizes = [256 * (1 + i % 40) for i in range(600)]
    offsets = holes(tlsf, [*sizes, 256], free=[])
    for i in range(0, 600, 2):
        tlsf.release(offsets[i], sizes[i])
    assert tlsf.free_extent_count() == 301
    # The bitmaps alone (a first-level word, then one row's word) skip every small class.
    top = (64 << 20) - sum(sizes) - 256
    assert tlsf.find_class(1 << 20) == mapping_insert(top)
    offset = tlsf.reserve(1 << 20, 256)
    assert offset == sum(sizes) + 256  # from the large extent past every block
    for n in (1, 15, 16, 17, 31, 32, 33, 1000, 4097):  # the flat arithmetic matches the mapping
        fl, sl = mapping_search(n)
        assert floor_of_class((fl << SL_BITS) + sl, SL_BITS) >= n


def test_tlsf_retries_padded_when_an_extent_is_misaligned() -> None:
    tlsf = TLSF(64 * K)
    assert tlsf.reserve(16, 16) == 0
    assert tlsf.reserve(4 * K, 4 * K) == 4 * K
    assert tlsf.free_extents() == [(16, 4 * K - 16), (8 * K, 56 * K)]


def test_tlsf_falls_back_to_a_padded_then_a_full_search_for_alignment() -> None:
    tlsf = TLSF(8 * K)
    assert tlsf.reserve(16, 16) == 0
    # The only extent, [16, 8 KiB), starts unaligned; no extent is 4 KiB + 4095 long, so the
    # padded O(1) search fails too and the scan finds the aligned 4 KiB at its top.
    assert tlsf.reserve(4 * K, 4 * K) == 4 * K
    assert tlsf.free_extents() == [(16, 4 * K - 16)]


def test_tlsf_scans_its_own_class_when_nothing_larger_is_left() -> None:
    tlsf = TLSF(8 * K)
    assert [tlsf.reserve(n, 4) for n in (1100, 256, 8 * K - 1356)] == [0, 1100, 1356]
    tlsf.release(0, 1100)
    assert tlsf.find_class(1100) is None  # 1100 is no class floor: the class above is empty
    assert tlsf.reserve(1100, 4) == 0
    assert tlsf.free_bytes() == 0


def test_tlsf_grows_the_extent_below_in_place_within_its_class() -> None:
    tlsf = TLSF(64 * K)
    assert tlsf.reserve(4 * K, 256) == 0
    assert tlsf.reserve(128, 128) == 4 * K
    assert tlsf.reserve(256, 128) == 4 * K + 128
    tlsf.release(0, 4 * K)
    tlsf.release(4 * K, 128)  # 4096 + 128 stays below the next class floor (4352)
    assert tlsf.free_extents() == [(0, 4 * K + 128), (4 * K + 384, 60 * K - 384)]
    assert tlsf.largest_free() == 60 * K - 384
    assert tlsf.reserve(4 * K + 128, 256) == 4 * K + 512  # a 4224 B extent is not >= 4352


# --- every strategy -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [FirstFit, NextFit, BestFit, SegregatedFit, Buddy, TLSF])
def test_a_request_beyond_max_size_is_refused_not_raised(cls) -> None:  # type: ignore[no-untyped-def]
    # The arena checks the upper size bound only after the strategy refuses (see strategy.py).
    strategy = cls(1 << 20)
    before = strategy.free_extents()
    assert strategy.reserve(1 << 61, 256) is None
    assert strategy.reserve((1 << 70) + 256, 256) is None
    assert strategy.free_extents() == before


@pytest.mark.skipif(COMPILED, reason="the compiled build keeps no class bytes (it walks sizes)")
@pytest.mark.parametrize("cls", [FirstFit, NextFit])
def test_the_class_bytes_mirror_the_free_extents(cls) -> None:  # type: ignore[no-untyped-def]
    # The pure build's C-level search reads one byte per extent (its power of two); it must
    # never go stale, whatever mix of alignments, splits and merges happens.
    import random

    rng = random.Random(7)
    strategy = cls(1 << 20)
    live: list[tuple[int, int]] = []
    for _ in range(2000):
        if live and rng.random() < 0.45:
            strategy.release(*live.pop(rng.randrange(len(live))))
        else:
            alignment = rng.choice([4, 256, 4096])
            nbytes = rng.randrange(1, 20_000) // alignment * alignment + alignment
            offset = strategy.reserve(nbytes, alignment)
            if offset is not None:
                assert offset % alignment == 0
                live.append((offset, nbytes))
        sizes = [size for _, size in strategy.free_extents()]
        assert strategy._classes == bytearray([*(s.bit_length() for s in sizes), 0])
    for offset, nbytes in live:
        strategy.release(offset, nbytes)
    assert strategy.free_extents() == [(0, 1 << 20)]


@pytest.mark.parametrize("strategy", [FirstFit, NextFit, BestFit, Buddy, TLSF, SegregatedFit])
@pytest.mark.parametrize("full", [True, False])
def test_a_direct_reserve_of_no_bytes_is_refused_and_changes_nothing(
    strategy: type, full: bool
) -> None:
    # The Arena never asks for 0 bytes; a caller using a strategy directly may. On a full
    # region first and next fit used to take the end sentinel (lost, the next release failed)
    # and buddy handed out a block that broke its bitmap.
    s = strategy(4096)
    taken = 4096 if full else 1024
    offset = s.reserve(taken, 256)
    before = s.free_extents()
    for nbytes in (0, -1):
        with pytest.raises(InvalidSizeError):
            s.reserve(nbytes, 1)
        assert s.free_extents() == before
    s.release(offset, taken)
    assert s.reserve(4096, 256) == 0  # the whole region is one free extent again
