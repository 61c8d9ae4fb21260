"""The runtime's modules import each other in one direction, and none reaches into another.

Every import counts: those under ``if TYPE_CHECKING:`` and those inside functions too, since a
circle hidden there is still a circle a reader must untangle (``shape_code`` once called
``kernel_recording``, which called back into the program, which called ``shape_code``). The
stages take the program's :class:`~tensorarena.runtime.compiler.Compiler`; only the modules
above the program (the package, the backend, the training step, the front) import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tensorarena

ROOT = Path(tensorarena.__file__).parent
RUNTIME = ROOT / "runtime"

#: The modules that may import ``tensorarena.runtime.program``: itself and those above it.
ABOVE_PROGRAM = {"runtime/__init__.py", "runtime/backend.py", "runtime/training.py",
                 "runtime/program.py"}
FRONT = ("bench/", "cli/", "cli.py", "__init__.py", "__main__.py")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(path: Path) -> set[str]:
    """Every ``tensorarena`` module ``path`` imports, anywhere in it (a name imported from a
    package counts as its submodule where one of that name exists, else as the package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = ROOT.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                sub = base / f"{alias.name}.py"
                found.add(f"{node.module}.{alias.name}" if sub.exists() else node.module)
    return {name for name in found if name.split(".")[0] == "tensorarena"}


def _runtime_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in sorted(RUNTIME.glob("*.py"))}
    return {name: _imported(path) & modules.keys() for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in order, the first repeated), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for other in sorted(graph.get(name, ())):
            if state.get(other) == 1:
                return [*path[path.index(other):], other]
            if other not in state and (found := visit(other)) is not None:
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_runtime_has_no_import_cycle() -> None:
    cycle = _cycle(_runtime_graph())
    assert cycle is None, "runtime modules import each other in a circle: " + " -> ".join(cycle)


def test_only_the_modules_above_the_program_import_it() -> None:
    importers = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in ABOVE_PROGRAM or relative.startswith(FRONT):
            continue
        if "tensorarena.runtime.program" in _imported(path):
            importers.append(relative)
    assert importers == [], f"below the program, these import it: {importers}"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _trees() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(RUNTIME.glob("*.py"))}


def _own_privates(tree: ast.Module) -> set[str]:
    """The underscored attributes a module's classes set or read on ``self`` (or ``cls``)."""
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls") and _private(node.attr)}


def test_no_runtime_module_reaches_into_another_modules_objects() -> None:
    # The program's state is the Compiler's, read by public names: program._x is refused
    # outright outside program.py, and so is any module's _x (set on self by one of our
    # classes) read from another module. torch's own privates (graph._codegen) are torch's.
    trees = _trees()
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for attr in _own_privates(tree):
            owners.setdefault(attr, set()).add(name)
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            last = (receiver.id if isinstance(receiver, ast.Name)
                    else receiver.attr if isinstance(receiver, ast.Attribute) else "")
            into_program = last.lstrip("_") in ("program", "compiler") and name != "program.py"
            if into_program or name not in owners.get(node.attr, {name}):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == [], f"reach-ins into another module's private state: {found}"


def test_no_runtime_module_imports_an_underscored_name() -> None:
    found = [f"{name}:{node.lineno} {node.module}.{alias.name}"
             for name, tree in _trees().items() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module
             and node.module.split(".")[0] == "tensorarena"
             for alias in node.names if _private(alias.name)]
    assert found == [], f"imports of another module's underscored names: {found}"


def test_the_runtime_tests_read_no_private_attribute_of_ours() -> None:
    # A test that reads program._x pins an implementation detail; the public face (attributes,
    # report(), repr) says what a user can see. torch's own privates (torch._C) are torch's.
    ours = ("program", "step", "compiler", "workspace", "other", "current", "entry")
    found = []
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and isinstance(node.value, ast.Name) and node.value.id.endswith(ours)):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == [], f"runtime tests reading private attributes: {found}"
