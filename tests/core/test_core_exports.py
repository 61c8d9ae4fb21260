"""The public names of ``tensorarena.core``: present, documented, and in the registry's order."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

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
        assert cls.__doc__ and _documented(cls, "reserve") and _documented(cls, "release")
        assert strategy_factory(name) is cls
        assert name.split("_")[0] in repr(strategy).lower()


def _documented(cls: type, method: str) -> bool:
    """Whether ``cls.method`` has a docstring in the source (the compiled build keeps none)."""
    for klass in cls.__mro__:
        if method in vars(klass):
            if getattr(klass, method).__doc__:
                return True
            module = Path(inspect.getfile(sys.modules[klass.__module__]))
            source = module.with_name(module.name.split(".", 1)[0] + ".py")
            for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and node.name == klass.__name__:
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and item.name == method:
                            return bool(ast.get_docstring(item))
            return False
    return False
