"""The operations first and best fit's packed extents share, on ``vec[i64]`` (compiled only).

:mod:`tensorarena.core._packed_first_fit` and :mod:`tensorarena.core._packed_best_fit` keep their
address arrays *downward* (highest address first) in mypyc's packed arrays (``librt.vecs``); the
search by address and the insertion and deletion of an extent are the same in both, so they live
here once. A ``vec`` is a value: ``insert`` and ``delete`` return the vec to keep (its buffer may
move). The pure build never calls these and never imports ``librt``: the names below exist for
the type checker and mypyc alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # compiled to native operations; nothing is imported at run time
    from librt.vecs import append, pop, vec
    from mypy_extensions import i64

__all__ = ["bit_length", "count_at_least", "delete", "insert"]


def count_at_least(keys: vec[i64], key: i64) -> i64:
    """In descending ``keys``, how many lead the rest by being at least ``key`` (bisection,
    branch-free as in :mod:`tensorarena.core._bisect`)."""
    n: i64 = len(keys)
    lo: i64 = 0
    if n <= 0:
        return 0
    while n > 1:
        half = n >> 1
        if keys[lo + half] >= key:
            lo += half
        n -= half
    if keys[lo] >= key:
        lo += 1
    return lo


def insert(items: vec[i64], i: i64, item: i64) -> vec[i64]:
    """``items`` with ``item`` inserted at index ``i`` (item by item: librt has no insert)."""
    items = append(items, item)
    j: i64 = len(items) - 1
    while j > i:
        items[j] = items[j - 1]
        j -= 1
    items[i] = item
    return items


def delete(items: vec[i64], i: i64) -> vec[i64]:
    """``items`` without the item at index ``i``."""
    items, _ = pop(items, i)
    return items


def bit_length(n: i64) -> i64:
    """``n.bit_length()`` of a native int."""
    return int(n).bit_length()
