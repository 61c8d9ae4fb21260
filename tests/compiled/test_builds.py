"""The two builds of the allocation core: what runs is what was built; the pure one still passes.

``make test`` installs the compiled build where a C compiler is present, so the whole suite runs on
it; the strategy state machine and the resource conformance suite are run here once more on the
pure build (the same ``.py`` files, imported from a copy of ``src/`` without the extensions) in a
child process, so neither build can drift from the other. The compiled build's arrays have a native
(C) owner; the owner suites are run once more with it blocked, so the ctypes fallback that the pure
build uses is tested by the compiled build too.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import tensorarena
from tensorarena._version import COMPILED_MODULES, NATIVE_EXTENSIONS, build, compiled_modules

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
# The suites the pure build must pass too: the hypothesis state machine over every strategy, the
# arena's record of recent frees (a ring the compiled build indexes natively), the conformance
# suite every resource is run through, and those of the compiled array path (the thread cache
# and ``empty`` with its owners; the thread cache's lock-free races and fast path, where a thread
# switch at any bytecode is what the pure build adds).
PURE_SUITES = [
    "tests/core/test_strategy_conformance.py",
    "tests/core/test_arena_recent_frees.py",
    "tests/test_resource_conformance.py",
    "tests/adaptors/test_thread_cached.py",
    "tests/adaptors/test_thread_cached_fast_path.py",
    "tests/adaptors/test_thread_cached_races.py",
    "tests/interop/test_owner.py",
    "tests/interop/test_owner_reuse.py",
    "tests/interop/test_arrays.py",
]
# The suites of the array owner, run in the compiled build without the native owner.
OWNER_SUITES = [
    "tests/interop/test_owner.py",
    "tests/interop/test_owner_reuse.py",
    "tests/interop/test_arrays.py",
]
EVERY_EXTENSION = [*COMPILED_MODULES, *NATIVE_EXTENSIONS]


def _source_of(extension: Path) -> Path:
    """The ``.py`` mypyc compiled ``extension`` from, or the ``.c`` of a native extension."""
    stem = extension.name.split(".", 1)[0]
    python = extension.with_name(stem + ".py")
    return python if python.is_file() else extension.with_name(stem + ".c")


def test_the_build_is_all_or_nothing() -> None:
    compiled = compiled_modules()
    assert compiled in ([], EVERY_EXTENSION), f"partly compiled core: {compiled}"
    assert build() == ("compiled" if compiled else "pure")


def test_extensions_are_not_older_than_their_sources() -> None:
    # An edited .py shadowed by the extension of an older version would test stale code.
    for name in compiled_modules():
        module = importlib.import_module(name)
        extension = Path(str(module.__file__))
        source = _source_of(extension)
        assert extension.stat().st_mtime >= source.stat().st_mtime, (
            f"{extension.name} is older than {source.name}: reinstall (make test does)"
        )


def test_an_editable_install_imports_the_extensions_from_src() -> None:
    # pip install -e puts the extensions next to the sources; the package imported must be this
    # checkout's, and a compiled module's file the extension beside its .py.
    assert Path(tensorarena.__file__).resolve().parent == SRC / "tensorarena"
    for name in compiled_modules():
        path = Path(str(importlib.import_module(name).__file__))
        assert path.name.endswith(EXT_SUFFIX) and _source_of(path).is_file()


def test_class_docstrings_survive_compilation() -> None:
    from tensorarena.adaptors import ThreadCached, ThreadCacheStatistics
    from tensorarena.adaptors._thread_cache import ThreadCachedCore
    from tensorarena.core import TLSF, Arena, BestFit

    for cls in (Arena, BestFit, TLSF, ThreadCacheStatistics, ThreadCachedCore, ThreadCached):
        # mypyc's own __doc__ is the text signature ("Arena(capacity, ...)\n--\n\n").
        assert cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "("), cls


@pytest.mark.slow
def test_the_pure_build_passes_the_state_machine_and_the_conformance_suite(
    tmp_path: Path,
) -> None:
    pure = tmp_path / "src"
    shutil.copytree(
        SRC / "tensorarena",
        pure / "tensorarena",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"),
    )
    env = {**os.environ, "PYTHONPATH": str(pure)}
    check = subprocess.run(
        [sys.executable, "-c", "import tensorarena._version as v, tensorarena as t; "
         "print(v.build(), t.__file__)"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert check.stdout.split() == ["pure", str(pure / "tensorarena" / "__init__.py")]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PURE_SUITES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(build() != "compiled", reason="the compiled build only")
def test_the_compiled_build_passes_the_owner_suites_without_the_native_owner() -> None:
    # An import of a module set to None in sys.modules raises ImportError: the fallback's cause.
    script = (
        "import sys; sys.modules['tensorarena.interop._native_owner'] = None\n"
        "import pytest\n"
        "from tensorarena.interop.owner import NativeAllocation\n"
        "assert NativeAllocation is None\n"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *{OWNER_SUITES!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]
