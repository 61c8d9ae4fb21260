"""The segregated engine's own structures (segregated fit and TLSF): the chain of blocks, the
class lists, the two-level bitmap words, and the check that finds them corrupt.

Strategies are driven directly (offsets from 0), and every state is judged by an independent
model: the free extents are the complement of the held ones, merged where they touch.
"""

from __future__ import annotations

import random

import pytest

from tensorarena.core import TLSF, Arena, SegregatedFit
from tensorarena.core._segregated import SegregatedExtents, bin_class
from tensorarena.debug import EXPENSIVE
from tensorarena.errors import (
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    InvariantError,
    SizeMismatchError,
)
from tensorarena.sizes import MAX_SIZE

ENGINES = [SegregatedFit, TLSF]
K = 1024


def complement(held: dict[int, int], capacity: int) -> list[tuple[int, int]]:
    """The free extents that ``held`` (offset → size) leaves in ``[0, capacity)``."""
    extents = []
    position = 0
    for offset, size in sorted(held.items()):
        if offset > position:
            extents.append((position, offset - position))
        position = offset + size
    if position < capacity:
        extents.append((position, capacity - position))
    return extents


def churn(engine: SegregatedExtents, rng: random.Random, steps: int, sizes: list[int]) -> None:
    """Reserve and release at random (odd sizes, every alignment up to 4 KiB), checking each
    result against the model."""
    held: dict[int, int] = {}
    capacity = engine.capacity
    for _ in range(steps):
        if held and rng.random() < 0.45:
            offset = rng.choice(list(held))
            engine.release(offset, held.pop(offset))
        else:
            nbytes = rng.choice(sizes) + rng.randrange(7)
            alignment = 1 << rng.randrange(13)
            offset = engine.reserve(nbytes, alignment)
            if offset is None:
                # Refused only when no free extent holds it aligned.
                assert all(
                    ((start + alignment - 1) & -alignment) + nbytes > start + size
                    for start, size in complement(held, capacity)
                )
                continue
            assert offset % alignment == 0 and offset >= 0 and offset + nbytes <= capacity
            held[offset] = nbytes
        expected = complement(held, capacity)
        assert engine.free_extents() == expected
        assert engine.free_extent_count() == len(expected)
        assert engine.free_bytes() == capacity - sum(held.values())
        assert engine.largest_free() == max((size for _, size in expected), default=0)
    for offset, nbytes in held.items():
        engine.release(offset, nbytes)
    assert engine.free_extents() == [(0, capacity)]


@pytest.mark.parametrize("cls", ENGINES)
def test_odd_sizes_and_alignments_match_the_model(cls: type[SegregatedExtents]) -> None:
    churn(cls(70_001), random.Random(3), 600, [1, 3, 17, 100, 255, 1000, 3000, 9000])


@pytest.mark.parametrize("cls", ENGINES)
def test_capacities_beyond_2_to_the_31_match_the_model(cls: type[SegregatedExtents]) -> None:
    # Offsets and sizes past 32 bits (and sizes above the class tables' 4 MiB).
    churn(cls((5 << 32) + 12_345), random.Random(5), 300, [256, 5 << 20, 3 << 30, 1 << 32])


@pytest.mark.parametrize("cls", ENGINES)
def test_the_bitmap_words_stay_word_sized_up_to_max_size(cls: type[SegregatedExtents]) -> None:
    engine = cls(MAX_SIZE)
    offsets = [engine.reserve(n, 1) for n in (1, 3, 1 << 40, 7 << 50)]
    assert None not in offsets
    assert 0 < engine._fl_bits < 1 << 62
    assert all(0 <= row.bits < 1 << (1 << engine._sl_bits) for row in engine._rows)
    assert engine.largest_free() == MAX_SIZE - 4 - (1 << 40) - (7 << 50)


@pytest.mark.parametrize("cls", ENGINES)
def test_release_coalesces_below_above_and_both(cls: type[SegregatedExtents]) -> None:
    engine = cls(64 * K)
    a, b, c, d, e = (engine.reserve(K, 256) for _ in range(5))
    assert (a, b, c, d, e) == (0, K, 2 * K, 3 * K, 4 * K)
    engine.release(b, K)
    engine.release(c, K)  # below is free: grows [1K, 2K) up
    assert engine.free_extents() == [(K, 2 * K), (5 * K, 59 * K)]
    engine.release(a, K)  # above is free: [1K, 3K) grows down
    assert engine.free_extents() == [(0, 3 * K), (5 * K, 59 * K)]
    engine.release(e, K)  # the tail grows down over e
    engine.release(d, K)  # both sides free: one extent
    assert engine.free_extents() == [(0, 64 * K)] and engine.free_extent_count() == 1


@pytest.mark.parametrize("cls", ENGINES)
def test_a_misaligned_extent_is_carved_around(cls: type[SegregatedExtents]) -> None:
    engine = cls(64 * K)
    assert engine.reserve(100, 4) == 0
    # The only extent starts at 100: the aligned request is carved from its inside, leaving the
    # gap below it and the rest above it free.
    assert engine.reserve(K, 4 * K) == 4 * K
    assert engine.free_extents() == [(100, 4 * K - 100), (5 * K, 59 * K)]
    engine.release(4 * K, K)
    engine.release(0, 100)
    assert engine.free_extents() == [(0, 64 * K)]


def test_a_class_is_last_in_first_out() -> None:
    engine = SegregatedFit(64 * K)
    offsets = [engine.reserve(K, 256) for _ in range(6)]
    for i in (0, 2, 4):  # three 1 KiB holes in one class, 4 KiB apart
        engine.release(offsets[i], K)
    assert engine.reserve(K, 256) == offsets[4]  # the most recently freed
    assert engine.reserve(K, 256) == offsets[2]


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda e: setattr(e._rows[0], "bits", e._rows[0].bits ^ 1), id="row bit"),
        pytest.param(lambda e: setattr(e, "_fl_bits", e._fl_bits ^ 1), id="first-level bit"),
        pytest.param(lambda e: setattr(e, "_free", e._free + 256), id="free bytes"),
        pytest.param(lambda e: setattr(e, "_extents", e._extents + 1), id="extent count"),
        pytest.param(lambda e: setattr(e._first, "size", 512), id="block size"),
        pytest.param(lambda e: setattr(e._first.next_phys, "prev_phys", None), id="back link"),
        pytest.param(lambda e: e._held.clear(), id="held map"),
        pytest.param(lambda e: setattr(e._first.next_phys, "cls", 3), id="block class"),
        pytest.param(lambda e: setattr(e._first.next_phys, "next_phys", None), id="chain cut"),
    ],
)
def test_the_structure_check_finds_corruption(corrupt) -> None:  # type: ignore[no-untyped-def]
    engine = TLSF(64 * K)
    assert engine.reserve(256, 256) == 0  # held [0, 256), free [256, 64K)
    assert engine.reserve(K, 256) == 256
    engine.release(0, 256)  # free [0, 256), held [256, 1280), free [1280, 64K)
    engine.free_extents()  # sound before
    corrupt(engine)
    with pytest.raises(InvariantError):
        engine.free_extents()


def test_an_arena_in_debug_mode_finds_a_corrupt_engine() -> None:
    arena = Arena("1MiB", "segregated_fit", debug=EXPENSIVE)
    first = arena.allocate(1000)
    arena.allocate(1000)
    engine = arena._strategy
    assert isinstance(engine, SegregatedExtents)
    top = bin_class((1 << 20) - 2048, engine._sl_bits)
    engine._heads[top] = None  # the free tail vanishes from its list (its class bit stays set)
    arena._check_invariants(1)  # the counters still agree: only the expensive check sees it
    with pytest.raises(InvariantError, match="bit disagrees"):
        arena.deallocate(first)  # a release that leaves the tail alone


@pytest.mark.parametrize("cls", ENGINES)
def test_bad_direct_calls_raise_and_change_nothing(cls: type[SegregatedExtents]) -> None:
    # The arena validates first; a direct call, however wrong, must not corrupt the engine.
    engine = cls(64 * K)
    assert engine.reserve(100, 4) == 0
    before = engine.free_extents()
    with pytest.raises(InvalidSizeError):
        engine.reserve(0, 256)
    with pytest.raises(InvalidSizeError):
        engine.reserve(-256, 256)
    # The only free extent starts at 100, which these masks reject: the slow paths refuse them.
    # (A mask that lets 100 through would take the start of the free extent: free bytes.)
    for alignment in (0, -256, 5, 768):
        with pytest.raises(InvalidAlignmentError):
            engine.reserve(256, alignment)
    with pytest.raises(InvalidAddressError):
        engine.release(4, 96)
    with pytest.raises(SizeMismatchError):
        engine.release(0, 256)
    assert engine.free_extents() == before
    engine.release(0, 100)
    assert engine.free_extents() == [(0, 64 * K)]
