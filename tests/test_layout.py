"""The test tree itself: every test module has a unique file name.

Test folders are not packages (pytest's default import mode puts each folder on ``sys.path``),
so two ``test_models.py`` in two folders collide at collection and stop the whole run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_module_names_are_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("*.py") if path.name != "__init__.py")
    clashes = {name: count for name, count in names.items() if count > 1 and name != "conftest.py"}
    assert not clashes, f"rename one of each: {clashes}"
