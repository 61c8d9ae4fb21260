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


def test_compiled_flag_says_which_build_runs() -> None:
    # Best fit and the address-ordered engine choose their search by this flag.
    assert _bisect.COMPILED is (build() == "compiled")
