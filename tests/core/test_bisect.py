"""The compiled build's bisection agrees with the ``bisect`` module, keys over 64 bits included."""

from __future__ import annotations

import bisect
import random

import pytest

from tensorarena._version import build
from tensorarena.core import _bisect


@pytest.mark.parametrize("bits", [8, 40, 62, 63, 64, 100])
def test_bisect_left_and_insort_match_the_bisect_module(bits: int) -> None:
    rng = random.Random(bits)
    keys: list[int] = []
    expected: list[int] = []
    for _ in range(400):
        # Few distinct values, so equal keys (where left and right bisection differ) occur.
        key = rng.randrange(32) << (bits - 5) | rng.randrange(2)
        assert _bisect.bisect_left(keys, key) == bisect.bisect_left(expected, key)
        lo = rng.randrange(len(keys) + 1)
        hi = rng.randrange(lo, len(keys) + 1)
        assert _bisect.bisect_left_in(keys, key, lo, hi) == bisect.bisect_left(keys, key, lo, hi)
        _bisect.insort(keys, key)
        bisect.insort(expected, key)
        assert keys == expected


@pytest.mark.parametrize("bits", [8, 40, 62, 64])
def test_bisect_left_near_finds_what_bisect_left_finds_from_any_hint(bits: int) -> None:
    """Right, off by a few, far off, out of range: every hint gives the same index (equal keys
    included), for every key up to the last (the function's precondition)."""
    rng = random.Random(bits)
    for _ in range(300):
        keys = sorted(rng.randrange(64) << (bits - 6) for _ in range(rng.randrange(1, 40)))
        key = rng.randrange(keys[-1] + 1) if rng.random() < 0.8 else rng.choice(keys)
        expected = bisect.bisect_left(keys, key)
        for hint in {
            expected,
            expected + 1,
            expected - 1,
            expected + 3,
            expected - 5,
            expected + 9,
            expected - 12,
            0,
            len(keys) - 1,
            len(keys) + 7,
            -3,
        }:
            assert _bisect.bisect_left_near(keys, key, hint) == expected, (keys, key, hint)


def test_compiled_flag_says_which_build_runs() -> None:
    # Best fit and the address-ordered engine choose their search by this flag.
    assert _bisect.COMPILED is (build() == "compiled")
