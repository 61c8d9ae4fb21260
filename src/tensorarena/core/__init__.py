"""Bookkeeping over an abstract address range: placement strategies and arenas.

Pure Python, and compiled by mypyc from the same source where a C compiler was present at install
(``tensorarena --version`` says which build runs).
"""

from tensorarena._version import COMPILED_MODULES as _COMPILED_MODULES
from tensorarena.core.arena import DEFAULT_ALIGNMENT, DEFAULT_STRATEGY, Arena, fresh_arena_fits
from tensorarena.core.best_fit import BestFit
from tensorarena.core.buddy import Buddy
from tensorarena.core.docstrings import restore_class_docstrings as _restore_class_docstrings
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

_restore_class_docstrings(*(name for name in _COMPILED_MODULES if name.startswith(__name__ + ".")))
