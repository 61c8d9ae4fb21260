"""Bisection of sorted ``list[int]`` for the compiled build, where it beats the ``bisect`` module.

``bisect.bisect_left`` and ``bisect.insort`` are C, but each step goes through Python's generic
comparison (``PyObject_RichCompare`` on two int objects, ~15 ns). Compiled by mypyc (see
``setup.py``), the loops below compare unboxed ints inline, a few ns a step: when best fit's
searches were one ~10-step bisection over every key, three a pair, they cost ~10 % less of a pair
(``bench/RESULTS.md``); it now bisects short size bins and its address list, five a pair.
Interpreted, the same loops would cost several times the C module, so callers branch on
:data:`COMPILED` and the pure build keeps ``bisect``.

The keys stay Python ints (mypyc's tagged ``int``), not ``i64``: best fit's ``size << shift |
start`` keys, counted in granules, fit in 62 bits for capacities up to 2^39 bytes but not beyond
(nor for an odd capacity past 2^31), and an ``int`` that fits in 62 bits is unboxed by mypyc
anyway, so only those huge keys take the slower, exact path. The indices are ``i64``: native
arithmetic with no tag checks, and list reads that take the index as it is.
"""

from __future__ import annotations

from types import FunctionType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # a type only: mypyc compiles it to a C int64_t; no import at run time
    from mypy_extensions import i64

__all__ = ["COMPILED", "bisect_left", "bisect_left_in", "insort"]


def bisect_left(keys: list[int], key: int) -> int:
    """The first index whose key is not below ``key`` (``bisect.bisect_left``)."""
    lo: i64 = 0
    hi: i64 = len(keys)
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def bisect_left_in(keys: list[int], key: int, lo: i64, hi: i64) -> i64:
    """``bisect_left`` within ``keys[lo:hi]`` (``bisect.bisect_left(keys, key, lo, hi)``)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def insort(keys: list[int], key: int) -> None:
    """Insert ``key`` after any equal keys, keeping ``keys`` sorted (``bisect.insort``)."""
    lo: i64 = 0
    hi: i64 = len(keys)
    while lo < hi:
        mid = (lo + hi) >> 1
        if key < keys[mid]:
            hi = mid
        else:
            lo = mid + 1
    keys.insert(lo, key)


#: Whether this module runs compiled: mypyc turns its functions into built-in functions.
COMPILED: Final = not isinstance(bisect_left, FunctionType)
