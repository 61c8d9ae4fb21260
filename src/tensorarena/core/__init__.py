"""Bookkeeping over an abstract address range: placement strategies and arenas (pure Python)."""

from tensorarena.core.arena import DEFAULT_ALIGNMENT, DEFAULT_STRATEGY, Arena, fresh_arena_fits
from tensorarena.core.best_fit import BestFit
from tensorarena.core.buddy import Buddy
from tensorarena.core.first_fit import FirstFit
from tensorarena.core.next_fit import NextFit
from tensorarena.core.registry import STRATEGIES, StrategySpec, strategy_factory
from tensorarena.core.segregated_fit import SegregatedFit
from tensorarena.core.strategy import PlacementStrategy, StrategyFactory
from tensorarena.core.tlsf import TLSF

__all__ = [
    "DEFAULT_ALIGNMENT",
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "TLSF",
    "Arena",
    "BestFit",
    "Buddy",
    "FirstFit",
    "NextFit",
    "PlacementStrategy",
    "SegregatedFit",
    "StrategyFactory",
    "StrategySpec",
    "fresh_arena_fits",
    "strategy_factory",
]
