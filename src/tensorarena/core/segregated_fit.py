"""Segregated fit: free extents binned by size class, four classes per power of two.

The classes follow jemalloc and RMM's arena: sizes below 8 have a class each, and every power of
two above is cut into four equal steps (8, 10, 12, 14, 16, 20, 24, 28, 32, ...), so the extents
of one class differ in size by less than a quarter. Each class holds its free extents in a list
(pushed and popped at its head: last-in first-out, which keeps recently freed memory warm), and
two levels of bitmap words mark the non-empty classes.

A reservation rounds the request *up* to a class boundary: every extent in that class or above is
large enough, so the lowest set bit at or above that class (``(m & -m).bit_length()``, in the
class's row, else in the first row above it) names the class to pop from in O(1), falling back to
larger classes automatically. Only when nothing there
fits (or alignment gets in the way) does a slow path scan the request's own class, whose extents
may or may not be large enough, and then the larger ones.

This is a segregated *free list*, not a slab: the extent taken is split, the remainder goes back to
its own class, and a released block coalesces with its free neighbours (found through the chain of
blocks in address order: boundary tags) before it is binned, so freeing everything restores one
extent. The machinery (and how its hot paths are made cheap: native blocks, word-sized bitmaps,
class tables instead of arithmetic) is shared with TLSF in :mod:`tensorarena.core._segregated`;
segregated fit is that engine with four classes per power of two.
"""

from __future__ import annotations

from typing import ClassVar

from tensorarena.core._segregated import SegregatedExtents, bin_class, floor_of_class

__all__ = ["SegregatedFit", "class_floor", "size_class"]


def size_class(nbytes: int) -> int:
    """The class of a free extent of ``nbytes``: the class whose range contains it."""
    return bin_class(nbytes, 2)


def class_floor(cls: int) -> int:
    """The smallest size in class ``cls``."""
    return floor_of_class(cls, 2)


class SegregatedFit(SegregatedExtents):
    """Size-class free lists over ``[0, capacity)``, O(1) search, splitting and coalescing."""

    name: ClassVar[str] = "segregated_fit"
    coalesces: ClassVar[bool] = True
    exact: ClassVar[bool] = True  #: reserve(n) takes exactly n bytes
    _SL_BITS = 2
