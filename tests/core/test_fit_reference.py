"""First, next and best fit place every block exactly where a brute-force model says.

The model keeps the free extents as a plain sorted list of ``(offset, nbytes)`` and states each
rule in a line: first fit takes the lowest extent that holds the request aligned, best fit the
smallest (lowest offset on ties), next fit the first at or after the roving pointer, wrapping
once. The strategies keep indexes in granules, sentinels and size-ordered keys; the model keeps
none, so it is an independent judge of both. Capacities above 2^31 bytes and up to 2^62 (keys
past 62 bits), odd capacities, alignments from 1 byte up, and odd sizes that refine best fit's
granule in mid-stream are all driven through it, seeded.
"""

from __future__ import annotations

import random

import pytest

from tensorarena.core import BestFit, FirstFit, NextFit
from tensorarena.core._bisect import COMPILED


class Model:
    """The free extents of ``[0, capacity)`` and the three placement rules, by brute force."""

    def __init__(self, capacity: int, rule: str) -> None:
        self.free = [(0, capacity)] if capacity else []
        self.rule = rule
        self.rover = 0

    def _fits(self, extent: tuple[int, int], nbytes: int, alignment: int) -> int | None:
        offset, size = extent
        aligned = -(-offset // alignment) * alignment
        return aligned if aligned + nbytes <= offset + size else None

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        if self.rule == "best_fit":
            order = sorted(self.free, key=lambda e: (e[1], e[0]))
        elif self.rule == "next_fit":
            order = [e for e in self.free if e[0] + e[1] > self.rover]
            order += [e for e in self.free if e[0] + e[1] <= self.rover]
        else:
            order = list(self.free)
        for extent in order:
            aligned = self._fits(extent, nbytes, alignment)
            if aligned is not None:
                offset, size = extent
                i = self.free.index(extent)
                end = offset + size
                pieces = [(offset, aligned - offset), (aligned + nbytes, end - aligned - nbytes)]
                self.free[i : i + 1] = [p for p in pieces if p[1]]
                self.rover = aligned + nbytes
                return aligned
        return None

    def release(self, offset: int, nbytes: int) -> None:
        self.free.append((offset, nbytes))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for start, size in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((start, size))
        self.free = merged


STRATEGIES: dict[str, type[FirstFit | NextFit | BestFit]] = {
    "first_fit": FirstFit,
    "next_fit": NextFit,
    "best_fit": BestFit,
}
CAPACITIES = [1 << 20, 1_000_003, 3 << 31, (1 << 40) + 3 * 256, 1 << 62]


def _request(rng: random.Random, capacity: int, odd: bool) -> tuple[int, int]:
    """A size and an alignment: mostly small, sometimes a large share of the region."""
    alignment = rng.choice([1, 2, 8, 256, 256, 256, 4096] if odd else [256, 256, 1024, 4096])
    large = rng.random() < 0.1
    nbytes = rng.randrange(1, capacity // 4 + 2) if large else rng.randrange(1, 40_000)
    nbytes = -(-nbytes // alignment) * alignment  # the arena rounds up to the alignment
    if not odd:
        nbytes = -(-nbytes // 256) * 256
    return nbytes, alignment


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_placements_match_the_model(name: str, capacity: int) -> None:
    rng = random.Random(capacity ^ len(name))
    strategy = STRATEGIES[name](capacity)
    model = Model(capacity, name)
    live: list[tuple[int, int]] = []
    for step in range(1500):
        odd = step >= 900  # odd sizes and small alignments only later: best fit refines then
        if live and rng.random() < 0.45:
            offset, nbytes = live.pop(rng.randrange(len(live)))
            strategy.release(offset, nbytes)
            model.release(offset, nbytes)
        else:
            nbytes, alignment = _request(rng, capacity, odd)
            placed = strategy.reserve(nbytes, alignment)
            assert placed == model.reserve(nbytes, alignment), (step, nbytes, alignment)
            if placed is not None:
                live.append((placed, nbytes))
        if step % 50 == 0 or step > 1450:
            assert strategy.free_extents() == model.free
            assert strategy.free_bytes() == sum(size for _, size in model.free)
            assert strategy.largest_free() == max((size for _, size in model.free), default=0)
            assert strategy.free_extent_count() == len(model.free)
            if isinstance(strategy, BestFit):
                strategy._check_invariants()
    for offset, nbytes in live:
        strategy.release(offset, nbytes)
    assert strategy.free_extents() == [(0, capacity)]


def test_best_fit_counts_in_granules_and_refines_for_an_odd_request() -> None:
    bf = BestFit(1 << 34)
    assert bf.granule == 256
    assert bf.reserve(1024, 256) == 0
    assert bf.reserve(3 << 30, 256) == 1024
    bf.release(0, 1024)
    assert bf.reserve(1000, 8) == 0  # not a multiple of 256: the lists count in 8-byte units now
    assert bf.granule == 8
    bf._check_invariants()
    assert bf.free_extents() == [(1000, 24), ((3 << 30) + 1024, (1 << 34) - (3 << 30) - 1024)]
    assert bf.reserve(24, 8) == 1000  # the tightest extent, found in the finer unit
    bf.reset()
    assert bf.granule == 256 and bf.free_extents() == [(0, 1 << 34)]


@pytest.mark.parametrize("capacity", [1_000_003, (1 << 40) + 1, 768])
def test_best_fit_granule_follows_the_capacity(capacity: int) -> None:
    bf = BestFit(capacity)
    assert bf.granule == min(capacity & -capacity, 256)
    assert bf.reserve(capacity, 1) == 0
    assert bf.free_extents() == [] and bf.largest_free() == 0
    assert bf.reserve(1, 1) is None
    bf.release(0, capacity)
    assert bf.free_extents() == [(0, capacity)]
    bf._check_invariants()


def test_best_fit_refuses_an_odd_request_beyond_the_capacity_without_refining() -> None:
    bf = BestFit(1 << 20)
    assert bf.reserve((1 << 20) + 1, 1) is None
    assert bf.reserve((1 << 70) + 1, 1) is None
    assert bf.granule == 256


@pytest.mark.parametrize("side", ["below", "above"])
def test_best_fit_reorders_a_bin_when_a_merge_grows_an_extent_within_it(side: str) -> None:
    """A release merging with one neighbour into an extent of the neighbour's size bin (its key
    now ranks past a larger extent's of that bin): the bins stay sorted, and the next requests
    still get the smallest fit."""
    g = 256
    bf = BestFit(100 * g)
    # Granules: [0, 9) free-to-be, [9, 11) the released block, [11, 12) held, [12, 22) free-to-be
    # (size 10), [22, 23) held, [23, 35) free-to-be (size 12), the rest held. For "above", the
    # first two swap: the block [0, 2) sits below a 9-granule extent [2, 11).
    first, second = (9, 2) if side == "below" else (2, 9)
    a = bf.reserve(first * g, g)
    b = bf.reserve(second * g, g)
    offsets = [bf.reserve(n * g, g) for n in (1, 10, 1, 12, 65)]
    assert None not in (a, b, *offsets)
    block, neighbour = (b, a) if side == "below" else (a, b)
    for offset, n in ((neighbour, 9), (offsets[1], 10), (offsets[3], 12)):
        assert offset is not None
        bf.release(offset, n * g)
    bf._check_invariants()
    assert block is not None
    bf.release(block, 2 * g)  # the merged extent [0, 11): 11 granules, bin 4 as 9 was
    bf._check_invariants()
    assert bf.free_extents() == [(0, 11 * g), (12 * g, 10 * g), (23 * g, 12 * g)]
    assert bf.reserve(11 * g, g) == 0
    assert bf.reserve(10 * g, g) == 12 * g
    bf._check_invariants()


def test_best_fit_merges_within_a_bin_when_the_extent_keeps_its_rank() -> None:
    """A merge that grows the only extent of a bin leaves one extent of the merged size."""
    g = 256
    bf = BestFit(64 * g)
    a = bf.reserve(9 * g, g)
    b = bf.reserve(1 * g, g)
    held = bf.reserve(54 * g, g)
    assert (a, b, held) == (0, 9 * g, 10 * g)
    bf.release(0, 9 * g)
    bf.release(9 * g, g)  # [0, 10): 10 granules, bin 4 as 9 was
    bf._check_invariants()
    assert bf.free_extents() == [(0, 10 * g)]
    assert bf.reserve(10 * g, g) == 0


def test_best_fit_places_alike_across_a_refine_that_takes_its_keys_past_62_bits() -> None:
    """Compiled, best fit keeps its extents in packed 64-bit arrays while its keys fit 62 bits
    and in Python lists beyond: a refine to 1-byte granules of a 2^34-byte region (keys of 70
    bits) moves it to the lists and ``reset`` back, with every placement the model's."""
    capacity = 1 << 34
    rng = random.Random(13)
    bf = BestFit(capacity)
    model = Model(capacity, "best_fit")
    assert (bf._packed is not None) is COMPILED
    live: list[tuple[int, int]] = []
    for step in range(600):
        if step == 300:
            assert bf.reserve(1001, 1) == model.reserve(1001, 1)  # refines to 1-byte granules
            assert bf.granule == 1 and bf._packed is None
        if live and rng.random() < 0.45:
            offset, nbytes = live.pop(rng.randrange(len(live)))
            bf.release(offset, nbytes)
            model.release(offset, nbytes)
        else:
            nbytes, alignment = _request(rng, capacity, step > 300)
            placed = bf.reserve(nbytes, alignment)
            assert placed == model.reserve(nbytes, alignment), (step, nbytes, alignment)
            if placed is not None:
                live.append((placed, nbytes))
        if step % 25 == 0:
            assert bf.free_extents() == model.free
            assert bf.largest_free() == max((size for _, size in model.free), default=0)
            bf._check_invariants()
    bf.reset()
    assert bf.granule == 256 and (bf._packed is not None) is COMPILED
    assert bf.free_extents() == [(0, capacity)] and bf.free_bytes() == capacity
    assert bf.reserve(3 << 8, 256) == 0 and bf.largest_free() == capacity - (3 << 8)
