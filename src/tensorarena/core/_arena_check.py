"""The invariant checks of an :class:`~tensorarena.core.arena.Arena` (its debug mode).

:func:`check_arena` is what ``Arena._check_invariants`` runs after every call when the arena's
debug level asks for it (graded by :mod:`tensorarena.debug`): the counters at
:data:`~tensorarena.debug.CHEAP` (O(1)), and at :data:`~tensorarena.debug.EXPENSIVE` every live
block against every free extent of the strategy (O(n log n)). It raises
:class:`~tensorarena.errors.InvariantError` at the first broken invariant. Compiled with the
arena in the compiled build (it reads the arena's attributes directly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensorarena.debug import CHEAP, EXPENSIVE, check

if TYPE_CHECKING:
    from tensorarena.core.arena import Arena

__all__ = ["check_arena"]


def check_arena(arena: Arena, level: int) -> None:
    """Check the invariants of ``level`` in ``arena``; raise on the first broken one."""
    if level < CHEAP:
        return
    strategy = arena._strategy
    free = strategy.free_bytes()
    held = arena._initial_free - free
    check(arena._alloc_count >= arena._free_count >= 0, "more frees than allocations")
    requested = arena._requested_total - arena._requested_freed
    check(0 <= requested <= held, "requested bytes exceed the bytes the strategy holds")
    check(0 <= free <= arena._capacity, "more free bytes than capacity")
    check(strategy.largest_free() <= free, "the largest free extent exceeds the free bytes")
    if level < EXPENSIVE:
        return
    entries = [
        (a, (e, (e + 255) & -256) if isinstance(e, int) else e) for a, e in arena._live.items()
    ]
    check(len(entries) == len(arena), "live count drifts")
    check(all(type(a) is int for a, _ in entries), "a live address is not an exact int")
    blocks = sorted((a - arena._base, e[1]) for a, e in entries)
    extents = strategy.free_extents()
    previous_end = 0
    for offset, reserved in blocks:
        check(offset >= previous_end, f"live blocks overlap at offset {offset}")
        previous_end = offset + reserved
    check(previous_end <= arena._capacity, "a live block runs past the region")
    check(requested == sum(e[0] for _, e in entries), "requested bytes drift")
    requested_reserved = sum(e[1] for _, e in entries)
    # Free-list strategies carve exactly what is asked; others (buddy) may round it up.
    if getattr(strategy, "exact", False):
        check(held == requested_reserved, "reserved bytes drift")
    check(held >= requested_reserved, "live blocks occupy more than the strategy holds")
    free_total = 0
    previous_end = 0
    for offset, size in extents:
        check(size > 0 and offset >= previous_end, "free extents overlap or are empty")
        previous_end = offset + size
        free_total += size
    check(previous_end <= arena._capacity, "a free extent runs past the region")
    check(free_total == free, "free bytes disagree with free extents")
    # No live block may intersect a free extent: merge-walk the two sorted lists.
    i = 0
    for offset, reserved in blocks:
        while i < len(extents) and extents[i][0] + extents[i][1] <= offset:
            i += 1
        if i < len(extents):
            check(extents[i][0] >= offset + reserved, f"block at {offset} is also free")
    if strategy.coalesces and not entries:
        # Coalescing means an empty region is its initial extent set again (one extent, or
        # for a buddy system its initial blocks).
        initial = getattr(strategy, "initial_extents", None)
        expected = initial() if initial is not None else [(0, arena._capacity)]
        check(extents == expected, f"an empty arena should be {expected}, not {extents[:4]}")
