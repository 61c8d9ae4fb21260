"""The placement-strategy protocol: bookkeeping of the free space of one region ``[0, capacity)``.

A strategy knows nothing of addresses, owners or statistics; it only answers "where can n bytes
go?" and takes extents back. The :class:`~tensorarena.core.arena.Arena` validates every request
before it reaches a strategy, so strategies trust their input and keep their hot paths lean:
``release(offset, nbytes)`` is always called with an ``offset`` and ``nbytes`` that an earlier
``reserve(nbytes, alignment)`` returned and accepted, and ``nbytes`` is always a positive multiple
of ``alignment``, which is a power of two. ``nbytes`` may exceed the capacity, even
:data:`~tensorarena.sizes.MAX_SIZE` (the arena spends no comparison on that before the strategy
refuses): ``reserve`` then returns ``None`` like any request that does not fit.

Every built-in strategy passes one conformance suite (``tests/core/test_strategy_conformance.py``);
a new one joins it by being registered in :data:`tensorarena.core.registry.STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Protocol, runtime_checkable

__all__ = ["PlacementStrategy", "StrategyFactory"]


@runtime_checkable
class PlacementStrategy(Protocol):
    """Manages the free space of one contiguous region ``[0, capacity)``."""

    #: The strategy's name in snake_case (``"best_fit"``), as used in tables and options.
    name: ClassVar[str]
    #: True when freeing every reserved extent restores one free extent covering the region.
    coalesces: ClassVar[bool]
    # Optional: ``exact: ClassVar[bool] = True`` declares that ``reserve(n)`` takes exactly ``n``
    # bytes (no rounding), which ``Arena._check_invariants`` then checks to the byte.

    @property
    def capacity(self) -> int:
        """Size of the managed region in bytes."""
        ...

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take an extent of ``nbytes`` whose offset is a multiple of ``alignment``.

        Returns the offset, or ``None`` when no free extent can hold it (state unchanged).
        """
        ...

    def release(self, offset: int, nbytes: int) -> None:
        """Give back an extent that ``reserve(nbytes, ...)`` returned at ``offset``."""
        ...

    def reset(self) -> None:
        """Forget every reservation: the whole region is free again."""
        ...

    def free_bytes(self) -> int:
        """Total free bytes (usable or not)."""
        ...

    def largest_free(self) -> int:
        """Size of the largest free extent, the largest request that could still succeed."""
        ...

    def free_extent_count(self) -> int:
        """Number of separate free extents."""
        ...

    def free_extents(self) -> list[tuple[int, int]]:
        """Every free extent as ``(offset, nbytes)`` sorted by offset; for checks, not hot paths."""
        ...


StrategyFactory = Callable[[int], PlacementStrategy]
"""Makes a strategy for a region of the given capacity (a strategy class is one)."""
