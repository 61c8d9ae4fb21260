"""The layers of ``docs/architecture.md``: each imports only itself and the layers before it.

Every ``import`` of ``tensorarena`` in every module counts, the lazy ones inside functions too,
so a layer cannot reach up to a later one (``errors.py`` used to import the planner's ``Plan``
to format a message). ``if TYPE_CHECKING:`` imports count as well: the base is kept clean.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tensorarena

ROOT = Path(tensorarena.__file__).parent

#: Layers in order; a module may import from its own layer and every earlier one.
LAYERS = [
    ("base", {"errors", "sizes", "stats", "debug", "memory_kind", "streams", "_optional",
              "_version"}),
    ("core", {"core"}),
    ("memory", {"memory"}),
    ("adaptors", {"adaptors"}),
    ("interop", {"interop"}),
    ("planning", {"planning"}),
    # plans learned at run time: a resource (memory, adaptors) that plans (planning); trace's
    # replay runs it, so it sits before trace.
    ("learned", {"learned"}),
    # trace uses only the layers up to adaptors; it sits below runtime so that the runtime can
    # take its snapshots and its profiler walk from trace instead of keeping copies.
    ("trace", {"trace"}),
    ("runtime", {"runtime"}),
    ("report", {"report"}),
    # torch is the eager PyTorch front (use(), learned plans): any layer below may serve it; the
    # CPU allocator shim it drives is interop's, which the runtime's kernel arena shares.
    ("torch", {"torch"}),
    ("testing", {"testing"}),
    ("front", {"cli", "bench", "__init__", "__main__"}),
]


def _layer(top: str) -> int:
    for index, (_, names) in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"tensorarena.{top} is in no layer: add it to LAYERS in {__file__}")


def _module_top(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    return relative.parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.split(".")[0] == "tensorarena"]


MODULES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_later_layer(path: Path) -> None:
    own = _layer(_module_top(path))
    for line, name in _imports(path):
        parts = name.split(".")
        if len(parts) == 1:  # `import tensorarena` itself: only the front may
            assert own == len(LAYERS) - 1, f"{path.name}:{line} imports the package root"
            continue
        other = _layer(parts[1])
        assert other <= own, (
            f"{path.relative_to(ROOT)}:{line} ({LAYERS[own][0]}) imports {name} "
            f"({LAYERS[other][0]}), a later layer"
        )


def test_the_base_imports_nothing_of_ours_above_it() -> None:
    for name in ("errors.py", "sizes.py", "stats.py", "debug.py", "memory_kind.py", "streams.py"):
        for _, module in _imports(ROOT / name):
            assert _layer(module.split(".")[1]) == 0, f"{name} imports {module}"


ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def test_the_architecture_page_lists_these_layers_in_this_order() -> None:
    # The page's table is the one a newcomer reads: it must say what LAYERS enforces.
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.+?) \|", ARCHITECTURE.read_text(encoding="utf-8"),
                      flags=re.MULTILINE)
    assert [(int(number), name) for number, name, _ in rows] == [
        (index, name) for index, (name, _) in enumerate(LAYERS)]
    for (_, _, packages), (_, names) in zip(rows, LAYERS, strict=True):
        listed = set(re.findall(r"`(?:tensorarena\.)?(\w+)`", packages))
        assert listed == names, (packages, names)
