"""Bisection of sorted ``list[int]`` for the compiled build, where it beats the ``bisect`` module.

``bisect.bisect_left`` and ``bisect.insort`` are C, but each step goes through Python's generic
comparison (``PyObject_RichCompare`` on two int objects). Compiled by mypyc (see
``setup.py``), the loops below compare unboxed ints inline, a few ns a step: when best fit's
searches were one ~10-step bisection over every key, three a pair, they made a pair measurably
cheaper (``bench/RESULTS.md``); it now bisects short size bins and its address list, five a pair.
Interpreted, the same loops would cost several times the C module, so callers branch on
:data:`COMPILED` and the pure build keeps ``bisect``.

The keys stay Python ints (mypyc's tagged ``int``), not ``i64``: best fit's ``size << shift |
start`` keys, counted in granules, fit in 62 bits for capacities up to 2^39 bytes but not beyond
(nor for an odd capacity past 2^31), and an ``int`` that fits in 62 bits is unboxed by mypyc
anyway, so only those huge keys take the slower, exact path. The indices are ``i64``: native
arithmetic with no tag checks, and list reads that take the index as it is.

The loops are the branch-free form of bisection: the range halves whatever a comparison says,
and the comparison only decides whether the base moves, which the C compiler turns into a
conditional move; the textbook loop branches on it, and a bisection's branches mispredict
about half the time. Compiled first, next and best fit ran faster a pair for it
(``bench/RESULTS.md``).
"""

from __future__ import annotations

from types import FunctionType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # a type only: mypyc compiles it to a C int64_t; no import at run time
    from mypy_extensions import i64

__all__ = ["COMPILED", "bisect_left", "bisect_left_in", "insort"]


def bisect_left(keys: list[int], key: int) -> int:
    """The first index whose key is not below ``key`` (``bisect.bisect_left``)."""
    # The branch-free form: the range halves whatever each comparison says, and the comparison
    # only moves its base (a conditional move), where the textbook loop branches on it, which
    # mispredicts about half the time.
    n: i64 = len(keys)
    if not n:
        return 0
    base: i64 = 0
    while n > 1:
        half = n >> 1
        if keys[base + half] < key:
            base += half
        n -= half
    if keys[base] < key:
        base += 1
    return base


def bisect_left_in(keys: list[int], key: int, lo: i64, hi: i64) -> i64:
    """``bisect_left`` within ``keys[lo:hi]`` (``bisect.bisect_left(keys, key, lo, hi)``)."""
    n = hi - lo
    if n <= 0:
        return lo
    while n > 1:  # branch-free, as in bisect_left
        half = n >> 1
        if keys[lo + half] < key:
            lo += half
        n -= half
    if keys[lo] < key:
        lo += 1
    return lo


def insort(keys: list[int], key: int) -> None:
    """Insert ``key`` after any equal keys, keeping ``keys`` sorted (``bisect.insort``)."""
    n: i64 = len(keys)
    base: i64 = 0
    if n:
        while n > 1:  # branch-free, as in bisect_left
            half = n >> 1
            if not key < keys[base + half]:
                base += half
            n -= half
        if not key < keys[base]:
            base += 1
    keys.insert(base, key)


#: Whether this module runs compiled: mypyc turns its functions into built-in functions.
COMPILED: Final = not isinstance(bisect_left, FunctionType)
