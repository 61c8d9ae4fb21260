"""Strategy names → classes, and turning a user's strategy choice into a factory."""

from __future__ import annotations

from tensorarena.core.best_fit import BestFit
from tensorarena.core.buddy import Buddy
from tensorarena.core.first_fit import FirstFit
from tensorarena.core.next_fit import NextFit
from tensorarena.core.segregated_fit import SegregatedFit
from tensorarena.core.strategy import PlacementStrategy, StrategyFactory
from tensorarena.core.tlsf import TLSF
from tensorarena.errors import InvalidArgumentError, UnknownNameError

__all__ = ["STRATEGIES", "StrategySpec", "strategy_factory"]

#: Every built-in strategy by its snake_case name, in the order tables list them.
STRATEGIES: dict[str, type[PlacementStrategy]] = {
    cls.name: cls
    for cls in (FirstFit, NextFit, BestFit, SegregatedFit, Buddy, TLSF)
}

StrategySpec = str | StrategyFactory
"""A strategy name (``"best_fit"``), a strategy class, or any callable ``capacity -> strategy``."""


def strategy_factory(spec: StrategySpec) -> StrategyFactory:
    """Return a factory for ``spec``.

    Raises :class:`~tensorarena.errors.UnknownNameError` naming the known strategies for an
    unknown name, :class:`~tensorarena.errors.InvalidArgumentError` for anything that is
    neither a name nor a callable.
    """
    if isinstance(spec, str):
        try:
            return STRATEGIES[spec]
        except KeyError:
            raise UnknownNameError(
                f"unknown strategy {spec!r}; expected one of: {', '.join(STRATEGIES)}",
                kind="strategy", name=spec, known=tuple(STRATEGIES),
            ) from None
    if callable(spec):
        return spec
    raise InvalidArgumentError(
        f"strategy must be a name or a callable, not {type(spec).__name__} ({spec!r})"
    )
