"""Bookkeeping over an abstract address range: placement strategies and arenas (pure Python)."""

from tensorarena.core.arena import DEFAULT_ALIGNMENT, Arena, ArenaStatistics
from tensorarena.core.first_fit import FirstFit
from tensorarena.core.registry import STRATEGIES, StrategySpec, strategy_factory
from tensorarena.core.strategy import PlacementStrategy, StrategyFactory

__all__ = [
    "DEFAULT_ALIGNMENT",
    "STRATEGIES",
    "Arena",
    "ArenaStatistics",
    "FirstFit",
    "PlacementStrategy",
    "StrategyFactory",
    "StrategySpec",
    "strategy_factory",
]
