"""Debug checks, graded by cost: which invariant checks run after every allocator call.

mimalloc grades its assertions (``mi_assert`` cheap, ``mi_assert_internal``, and
``mi_assert_expensive`` only in debug builds); tensorarena does the same with three levels:

* ``0`` (``OFF``) — no checks: the hot paths are what the benchmarks measure;
* ``1`` (``CHEAP``) — after every call, checks that cost O(1): counters agree with each other;
* ``2`` (``EXPENSIVE``) — after every call, every invariant: live blocks disjoint, every byte
  accounted for, free lists consistent (O(n log n) per call).

An allocator reads the level *when it is made* (``debug=None``, the default): from
:func:`set_debug_level` if it was called, else from the ``TENSORARENA_DEBUG`` environment
variable (``0``/empty: off; ``1``: cheap; ``2`` or any other value: expensive). Setting either
later changes allocators made later, not those that exist.

A failed check raises :class:`~tensorarena.errors.InvariantError`, not ``assert``: checks that
vanished under ``python -O`` would not be checks.
"""

from __future__ import annotations

import os

from tensorarena.errors import InvalidArgumentError, InvariantError

__all__ = ["CHEAP", "EXPENSIVE", "OFF", "check", "debug_level", "resolve_debug", "set_debug_level"]

OFF = 0
CHEAP = 1
EXPENSIVE = 2

_override: int | None = None


def _from_environment() -> int:
    value = os.environ.get("TENSORARENA_DEBUG", "").strip()
    if value in ("", "0"):
        return OFF
    if value == "1":
        return CHEAP
    return EXPENSIVE


def debug_level() -> int:
    """The level allocators made now will use: the override, else ``TENSORARENA_DEBUG``."""
    return _from_environment() if _override is None else _override


def set_debug_level(level: int | bool | None) -> int | None:
    """Set the level for allocators made from now on; ``None`` goes back to the environment.

    ``True`` means :data:`EXPENSIVE`, ``False`` :data:`OFF`. Returns the previous override.
    """
    global _override
    previous = _override
    _override = None if level is None else resolve_debug(level)
    return previous


def resolve_debug(debug: int | bool | None) -> int:
    """An allocator's ``debug=`` argument as a level: ``None`` reads :func:`debug_level`."""
    if debug is None:
        return debug_level()
    if debug is True:
        return EXPENSIVE
    if debug is False:
        return OFF
    if type(debug) is not int or debug not in (OFF, CHEAP, EXPENSIVE):
        raise InvalidArgumentError(
            f"debug must be None, a bool or a level 0 (off), 1 (cheap) or 2 (expensive), "
            f"got {debug!r}"
        )
    return debug


def check(condition: bool, message: str) -> None:
    """Raise :class:`InvariantError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise InvariantError(message)
