"""Class docstrings for the compiled build, read back from the source that was compiled.

mypyc keeps no docstrings: a compiled class's ``__doc__`` is its text signature, or nothing, so
``help(Arena)`` would say nothing. The ``.py`` files travel with the extensions (they *are* the
pure build), so this reads each compiled module's source once at import and sets its classes'
docstrings (a compiled class accepts a new ``__doc__``; its methods' descriptors do not, so method
docstrings stay in the source and in the pure build). Nothing happens for interpreted modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

__all__ = ["restore_class_docstrings"]


def restore_class_docstrings(*module_names: str) -> None:
    """Give the classes of each compiled module among ``module_names`` their source docstrings."""
    for name in module_names:
        module = sys.modules[name]
        path = Path(getattr(module, "__file__", None) or "")
        if path.suffix == ".py":
            continue  # interpreted: the docstrings are there
        source = path.with_name(path.name.split(".", 1)[0] + ".py")
        if not source.is_file():
            continue  # a compiled install without its sources: nothing to read back
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                cls = getattr(module, node.name, None)
                doc = ast.get_docstring(node, clean=False)
                if cls is not None and doc and not getattr(cls, "__doc__", None):
                    cls.__doc__ = doc
