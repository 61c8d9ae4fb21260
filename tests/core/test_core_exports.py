"""The public names of ``tensorarena.core``: present, documented, and in the registry's order."""

from __future__ import annotations

import tensorarena.core as core
from tensorarena.core import STRATEGIES, PlacementStrategy, strategy_factory


def test_exported_names() -> None:
    assert set(core.__all__) == {
        "DEFAULT_ALIGNMENT", "DEFAULT_STRATEGY", "STRATEGIES", "TLSF", "Arena", "fresh_arena_fits",
        "BestFit", "Buddy", "FirstFit", "NextFit", "PlacementStrategy", "SegregatedFit",
        "StrategyFactory", "StrategySpec", "strategy_factory",
    }
    for name in core.__all__:
        assert hasattr(core, name), name


def test_every_strategy_satisfies_the_protocol_and_says_what_it_is() -> None:
    for name, cls in STRATEGIES.items():
        strategy = cls(1 << 20)
        assert isinstance(strategy, PlacementStrategy)
        assert cls.name == name and cls.coalesces
        assert cls.__doc__ and cls.reserve.__doc__ and cls.release.__doc__
        assert strategy_factory(name) is cls
        assert name.split("_")[0] in repr(strategy).lower()
