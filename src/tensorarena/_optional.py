"""Lazy imports of optional dependencies, with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from tensorarena.errors import MissingDependencyError

__all__ = ["load_torch", "require"]


def require(module: str, *, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` naming ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(module, extra, feature) from exc


def load_torch() -> ModuleType:
    """PyTorch, imported at first use: the one loader of the PyTorch front ends and the runtime."""
    return require("torch", extra="torch", feature="planning and running PyTorch graphs")
