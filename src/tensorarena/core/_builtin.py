"""The base class of the strategies shipped here, so that the compiled Arena calls them directly.

Any object that satisfies :class:`~tensorarena.core.strategy.PlacementStrategy` can place an
arena's blocks, and the arena calls it through Python's generic call (a bound method). In the
compiled build (see ``setup.py``) that call boxes each int argument (an allocation), goes through
the method's argument parser and unboxes them again, for every allocate and every deallocate. An
arena whose strategy derives from :class:`BuiltinStrategy` calls ``reserve``/``release`` through
the class's native method table instead: ints stay unboxed. Interpreted, the two calls cost the
same, and a strategy written elsewhere keeps the generic call.

The protocol stays the definition of a strategy: this class adds nothing to it and states nothing
that the protocol does not (it is not runtime-checkable, mypyc compiles no Protocol).
"""

from __future__ import annotations

__all__ = ["BuiltinStrategy"]


class BuiltinStrategy:
    """Base of the built-in strategies: the two hot methods, overridden by every one of them."""

    def reserve(self, nbytes: int, alignment: int) -> int | None:
        """Take ``nbytes`` aligned to ``alignment``: the offset, or ``None`` if they do not fit."""
        raise NotImplementedError

    def release(self, offset: int, nbytes: int) -> None:
        """Give back ``[offset, offset + nbytes)``, which an earlier ``reserve`` returned."""
        raise NotImplementedError
