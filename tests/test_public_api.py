"""The public namespaces: exported names exist, nothing heavy is imported, one error tree."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import subprocess
import sys

import numpy as np
import pytest

import tensorarena
from tensorarena import errors

NAMESPACES = [
    "tensorarena",
    "tensorarena.core",
    "tensorarena.memory",
    "tensorarena.memory.cuda",
    "tensorarena.adaptors",
    "tensorarena.interop",
    "tensorarena.planning",
    "tensorarena.report",
    "tensorarena.errors",
    "tensorarena.stats",
    "tensorarena.debug",
    "tensorarena.sizes",
    "tensorarena.streams",
    "tensorarena.testing",
    "tensorarena.testing.cuda",
]


@pytest.mark.parametrize("name", NAMESPACES)
def test_every_exported_name_exists_and_is_documented(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    assert len(set(module.__all__)) == len(module.__all__), f"{name}.__all__ has duplicates"
    for exported in module.__all__:
        value = getattr(module, exported)  # AttributeError names the missing export
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__doc__, f"{name}.{exported} has no docstring"


def test_top_level_exports_the_everyday_names() -> None:
    for name in ("Arena", "Pool", "HostMemory", "ThreadSafe", "ThreadCached", "empty", "zeros",
                 "scope", "default_resource", "OutOfMemoryError", "parse_size"):
        assert name in tensorarena.__all__


def test_every_public_exception_is_exported_at_the_top_level() -> None:
    """ScopeEscapeError, PlanDoesNotFitError and the unknown-planner error used to be missing."""
    for name in errors.__all__:
        assert name in tensorarena.__all__, name
        assert getattr(tensorarena, name) is getattr(errors, name)


def test_every_error_descends_from_tensorarena_error() -> None:
    classes = [getattr(errors, name) for name in errors.__all__]
    exceptions = [c for c in classes if issubclass(c, BaseException)]
    assert len(exceptions) >= 15
    for cls in exceptions:
        if issubclass(cls, Warning):
            assert issubclass(cls, errors.TensorArenaWarning)
        else:
            assert issubclass(cls, errors.TensorArenaError), cls
    assert issubclass(errors.OutOfMemoryError, MemoryError)
    assert issubclass(errors.DoubleFreeError, errors.InvalidAddressError)


def test_import_needs_only_numpy() -> None:
    code = (
        "import sys, tensorarena, tensorarena.planning, tensorarena.memory, tensorarena.adaptors; "
        "import tensorarena.memory.cuda; "
        "heavy = {'torch', 'onnx', 'transformers', 'rich', 'matplotlib', 'cuda', 'cupy', "
        "'numba'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_version_string() -> None:
    # The metadata pip wrote comes from src/tensorarena/_version.py, as tensorarena.__version__.
    assert importlib.metadata.version("tensorarena") == tensorarena.__version__
    assert tensorarena.__version__.count(".") >= 2


def test_cli_prints_the_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tensorarena", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"tensorarena {tensorarena.__version__} (Python ")
    assert f"NumPy {np.__version__}" in done.stdout
    assert done.stderr == ""


def test_the_types_the_planning_entry_points_take_are_exported_with_them() -> None:
    """plan(params=SolverParams(...), progress=...) needed tensorarena.planning.exact_params and
    .progress, and reorder(OpGraph(...)) .op_graph: private-looking module paths."""
    import typing

    import tensorarena.planning as planning

    taken: set[type] = set()
    for function in (planning.plan, planning.solve_exact, planning.reorder):
        for hint in typing.get_type_hints(function).values():
            stack = [hint]
            while stack:
                item = stack.pop()
                stack.extend(typing.get_args(item))
                if inspect.isclass(item) and item.__module__.startswith("tensorarena.planning"):
                    taken.add(item)
    taken |= {planning.OpGraph}  # reorder's source is typed Any (it takes fx graphs too)
    for cls in taken:
        assert cls.__name__ in planning.__all__, cls
        assert getattr(planning, cls.__name__) is cls
    assert {"SolverParams", "Progress", "OpGraph", "check_order"} <= set(planning.__all__)


def test_the_root_loads_names_on_first_use_and_plan_imports_only_the_planner() -> None:
    """``tensorarena plan`` spent 1.1 s of its start-up importing pools, adaptors and reports
    that it never used, before it read the CSV (issue 26)."""
    data = __file__.replace("test_public_api.py", "planning/data/toy.12.csv")
    code = (
        "import sys, tensorarena; "
        "assert {m for m in sys.modules if m.startswith('tensorarena')} == "
        "{'tensorarena', 'tensorarena._version'}, sorted(sys.modules); "
        "import tensorarena.cli.main as cli; "
        f"assert cli.main(['plan', {data!r}, '--json', '--quiet']) == 0; "
        "unused = {'tensorarena.memory', 'tensorarena.adaptors', 'tensorarena.report', "
        "'tensorarena.interop', 'tensorarena.core', 'tensorarena.trace'} & set(sys.modules); "
        "assert not unused, unused; "
        "assert tensorarena.Pool is tensorarena.memory.Pool and 'Pool' in dir(tensorarena)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_missing_root_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        tensorarena.nonexistent  # noqa: B018
