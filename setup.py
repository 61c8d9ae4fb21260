"""Build the allocation core compiled with mypyc where that can be done, pure Python otherwise.

Everything about the package is declared in ``pyproject.toml``; this file only adds the extension
modules. mypyc compiles the *same* ``.py`` files that the pure build runs (the annotated source is
the only source): each compiled module is a C extension installed beside its ``.py``, and Python's
import system prefers the extension. ``tensorarena --version`` says which build is active.

The compiled build is chosen when all of these hold, else the package installs as pure Python and
says why on the build log (pip shows it with ``-v``):

* ``TENSORARENA_PURE`` is unset or ``0`` (``TENSORARENA_PURE=1 pip install ...`` forces pure);
* mypyc imports (it ships with mypy, a build requirement);
* a C compiler and ``Python.h`` are present;
* mypyc's type check and the C compilation succeed (a failure falls back, it does not fail the
  install: the pure build is the reference and always works).

The compiled build also builds the hand-written C extensions of ``_version.NATIVE_EXTENSIONS``
(the native array owner, the DLPack capsule and ``empty``'s compiled entry,
``interop/_native_*.c`` and the headers they share): all of it or none, like the mypyc modules,
so a failure to compile any of them installs the pure build, which has a Python fallback for
each.

An editable install (``pip install -e .``) compiles in place: the extensions land in ``src/``
next to their sources. A later pure install removes them, so a stale extension never shadows an
edited ``.py`` (``make test`` reinstalls when a compiled source changes).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
SRC = HERE / "src"

# The modules mypyc compiles, as paths under src/: listed once, in _version.py (which imports
# nothing, so it can be run here without the package's dependencies).
_VERSION = runpy.run_path(str(SRC / "tensorarena" / "_version.py"))
COMPILED = [name.replace(".", "/") + ".py" for name in _VERSION["COMPILED_MODULES"]]
# The hand-written C extensions (module name, its one source under src/).
NATIVE = [(name, name.replace(".", "/") + ".c") for name in _VERSION["NATIVE_EXTENSIONS"]]
NATIVE_HEADERS = [
    "src/tensorarena/interop/_native_block.h",
    "src/tensorarena/interop/_native_capsule.h",
]
# mypy's view of the package while mypyc compiles: the compiled modules and the few they import,
# never the rest (``tensorarena/__init__.py`` imports every subpackage, and through them NumPy and
# torch: minutes of type checking at every install). Errors outside the compiled modules are not
# mypyc's business (``make lint`` reports them); skipped imports are typed ``Any``.
MYPY_CONFIG = """\
[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-tensorarena.*]
follow_imports = skip
[mypy-tensorarena.core.*,tensorarena.errors,tensorarena.sizes,tensorarena.debug,tensorarena.stats,tensorarena.memory_kind]
follow_imports = silent
"""
# One shared library holds the compiled code of every module above (mypyc's group); its name is
# fixed so a pure install can find and remove it.
GROUP = "tensorarena_core"


def _say(message: str) -> None:
    print(f"tensorarena build: {message}", file=sys.stderr)


def _pure_reason() -> str | None:
    """Why this install must be pure Python, or None when the compiled build can be tried."""
    if os.environ.get("TENSORARENA_PURE", "0") not in ("", "0"):
        return "TENSORARENA_PURE is set"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it ships with mypy)"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} not found)"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"no Python headers ({include}/Python.h not found)"
    return None


def _remove_in_place_extensions() -> None:
    """Delete extensions an earlier editable compiled install left in ``src/``."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    stale = [SRC / (path[: -len(".py")] + suffix) for path in COMPILED]
    stale += [SRC / (path[: -len(".c")] + suffix) for _, path in NATIVE]
    stale += list(SRC.glob(f"{GROUP}__mypyc*{suffix}"))
    for path in stale:
        if path.exists():
            path.unlink()
            _say(f"removed {path.relative_to(HERE)}")


class OptionalBuildExt(build_ext):
    """build_ext that falls back to the pure build when the C compilation fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # any compiler failure means "pure"
            _say(f"C compilation failed ({error}); installing the pure-Python build")
            _remove_in_place_extensions()

    def build_extension(self, ext: object) -> None:
        try:
            super().build_extension(ext)  # type: ignore[arg-type]
        except Exception as error:
            raise RuntimeError(error) from error


# The commands that build; setuptools also runs this file for metadata alone, where mypyc's type
# check (several seconds) would be wasted.
_BUILDING = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def _native_extensions() -> list[object]:
    # Paths relative to this file's directory, where setuptools runs (never absolute: it refuses).
    # The shared headers are dependencies: a change rebuilds every extension, the sdist ships them.
    return [
        Extension(
            name,
            sources=[f"src/{path}"],
            depends=NATIVE_HEADERS,
            extra_compile_args=["-Wall", "-Wextra"],
        )
        for name, path in NATIVE
    ]


def _ext_modules() -> list[object]:
    if not _BUILDING.intersection(sys.argv[1:]):
        return []
    reason = _pure_reason()
    if reason is None:
        from mypyc.build import mypycify

        target = HERE / "build" / "mypyc"
        target.mkdir(parents=True, exist_ok=True)
        config = target / "mypy.ini"
        config.write_text(MYPY_CONFIG)
        cwd = os.getcwd()
        # mypyc names modules after paths relative to the working directory: run from src/.
        os.chdir(SRC)
        try:
            modules: list[object] = list(
                mypycify(
                    [f"--config-file={config}", f"--cache-dir={target / 'cache'}", *COMPILED],
                    opt_level="3",
                    debug_level="0",
                    group_name=GROUP,
                    target_dir=str(target),
                )
            )
        except (SystemExit, Exception) as error:  # a type error means "pure"
            reason = f"mypyc failed ({error})"
        finally:
            os.chdir(cwd)
        if reason is None:
            _say(f"compiling {len(COMPILED)} modules with mypyc and {len(NATIVE)} C extensions")
            return modules + _native_extensions()
    _say(f"pure-Python build: {reason}")
    _remove_in_place_extensions()
    return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
