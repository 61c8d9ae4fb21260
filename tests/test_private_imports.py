"""No module of the package imports another module's underscored name.

Shared helpers get public names in the module that owns them (``docs/architecture.md``); an
underscored *module* (``core/_bisect.py``) is the package's own and may be imported by its
siblings, an underscored name inside a module is that module's alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorarena

ROOT = Path(tensorarena.__file__).parent


def _is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists() or any(
        path.parent.glob(path.name + ".*.so"))


def _private_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.module
                and node.module.split(".")[0] == "tensorarena"):
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not name.startswith("__") and not _is_module(
                    f"{node.module}.{name}"):
                found.append(f"{node.lineno} {node.module}.{name}")
    return found


def test_the_check_sees_a_private_name_and_lets_a_private_module_pass() -> None:
    source = ("from tensorarena.core import _bisect\n"
              "from tensorarena.planning.heuristics import _Hidden, place\n")
    assert _private_imports(source) == ["2 tensorarena.planning.heuristics._Hidden"]


def test_no_module_imports_another_modules_underscored_name() -> None:
    found = [f"{path.relative_to(ROOT).as_posix()}:{where}"
             for path in sorted(ROOT.rglob("*.py"))
             for where in _private_imports(path.read_text(encoding="utf-8"))]
    assert found == [], f"imports of another module's underscored names: {found}"
