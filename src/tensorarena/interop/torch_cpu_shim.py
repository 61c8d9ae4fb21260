"""Torch's CPU allocator shim: the one compiled extension behind every CPU allocation hook.

Python cannot replace torch's CPU allocator, so a small C++ extension does: an ``at::Allocator``
(``_torch_cpu_shim.cpp`` with ``_torch_cpu_routes.cpp``, ``_torch_cpu_route_calls.cpp``,
``_torch_cpu_serving.cpp``, ``_torch_cpu_serving_setup.cpp``, ``_torch_cpu_serving_calls.cpp``,
``_torch_cpu_step_log.cpp``, ``_torch_cpu_native_pool.cpp`` and
``_torch_cpu_native_pool_calls.cpp``, sharing ``_torch_cpu_shim.h`` and the
``_torch_cpu_routes.h``, ``_torch_cpu_serving.h``, ``_torch_cpu_step_log.h``,
``_torch_cpu_native_pool.h`` of their parts)
that forwards to the allocator it replaced unless asked otherwise. Two users ask, through this
one module (one compile, one allocator swap):

* :mod:`tensorarena.torch` routes a program's allocations to a memory resource while a route is
  set (``new_route``, ``set_route``, ``route_statistics``, ``routed_blocks``, ``shutdown``), and
  a route to learned plans serves their slots with no Python call
  (:mod:`tensorarena.learned.native_serving`: ``serving_*``, ``occupancy_*``; the step's log
  there, :mod:`tensorarena.learned.native_recorder`: ``step_log_*``), and a route to a
  :class:`~tensorarena.torch.NativePool` takes its blocks in C++ (``native_pool_*``);
* the planned executor (:mod:`tensorarena.runtime.kernel_arena`) arms it per node with a script
  of planned addresses (``install``, ``uninstall``, ``arm``, ``disarm``, ``record``,
  ``recorded``, ``outstanding``).

Every block the shim makes itself carries its deleter, which finds by address who made it: a
block goes back to the allocator or resource that made it, whichever is installed when it dies.
A block a route serves natively (a learned plan's slot, a native pool's block) is found in its
owner's own books, with no GIL and no process-wide table of blocks.

:func:`extension` compiles it on first use with ``torch.utils.cpp_extension.load`` (a C++
compiler, ``ninja`` and torch's headers needed; a few seconds once) into
``~/.cache/tensorarena/torch_cpu_shim/<torch>-<python>-<digest>``: the digest is of the sources
and their folder (each checkout builds its own), so a changed source (another checkout, a new
release) builds its own module instead of loading a stale one. Where it cannot be built,
:func:`unavailable` says why. Builds of one folder take turns under an ``flock`` that the system
releases when its holder dies, however it dies: torch's own ``lock`` file, which a build killed
halfway (Ctrl-C, a timeout) leaves behind and every later process would wait on forever, is
cleared under it (:func:`build_once`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # not POSIX: builds rely on torch's lock file alone
    fcntl = None  # type: ignore[assignment]

__all__ = ["MODULE", "SOURCES", "build_once", "extension", "unavailable"]

_T = TypeVar("_T")

_HERE = Path(__file__).parent
#: The sources of the extension (the header is hashed with them), and the module they build.
SOURCES = (_HERE / "_torch_cpu_shim.cpp", _HERE / "_torch_cpu_routes.cpp",
           _HERE / "_torch_cpu_route_calls.cpp", _HERE / "_torch_cpu_serving.cpp",
           _HERE / "_torch_cpu_serving_setup.cpp", _HERE / "_torch_cpu_serving_calls.cpp",
           _HERE / "_torch_cpu_step_log.cpp",
           _HERE / "_torch_cpu_native_pool.cpp", _HERE / "_torch_cpu_native_pool_calls.cpp")
_HEADERS = (_HERE / "_torch_cpu_shim.h", _HERE / "_torch_cpu_routes.h",
            _HERE / "_torch_cpu_serving.h", _HERE / "_torch_cpu_step_log.h",
            _HERE / "_torch_cpu_native_pool.h")
MODULE = "tensorarena_torch_cpu_shim"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tensorarena" / "torch_cpu_shim"


def _digest() -> str:
    # The folder too: cpp_extension's build file names the sources by path, so two checkouts
    # with the same sources sharing one build folder rebuild it in turn, and one's build lock
    # vanishes under the other ("could not build ...: FileNotFoundError: .../lock").
    digest = hashlib.sha256(str(_HERE.resolve()).encode())
    for path in (*SOURCES, *_HEADERS):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build_once(folder: Path, build: Callable[[], _T]) -> _T:
    """``build()`` while this process alone builds in ``folder`` (an ``flock`` on a file in it).

    torch's ``cpp_extension`` guards a build folder with a ``lock`` file that only the build that
    made it removes: a build killed halfway leaves it, and every later load of the folder waits
    for it forever. Every build here holds the ``flock`` first, which the system drops when its
    holder exits or is killed; so a ``lock`` found while holding it is a dead build's, removed.
    """
    if fcntl is None:
        return build()
    with open(folder / "build.flock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)
            return build()
        finally:
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)


@functools.cache
def _load() -> tuple[Any, str]:
    """The extension module and ``""``, or ``None`` and why it is unavailable."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        return None, f"torch is not importable ({exc})"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler!r} not found)"
    if not cpp_extension.is_ninja_available():
        return None, "ninja is not installed (torch.utils.cpp_extension needs it)"
    if not (Path(cpp_extension.include_paths()[0]) / "c10" / "core" / "CPUAllocator.h").is_file():
        return None, "torch's C++ headers are not installed"
    try:
        tag = f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{_digest()}"
        folder = _cache_dir() / tag.replace("+", "_")
        folder.mkdir(parents=True, exist_ok=True)
        module = build_once(folder, lambda: cpp_extension.load(
            name=MODULE, sources=[str(s) for s in SOURCES], extra_include_paths=[str(_HERE)],
            build_directory=str(folder), extra_cflags=["-O2"], verbose=False))
    except Exception as exc:  # a failed build leaves the program as it is without the shim
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"could not build {SOURCES[0].name}: {type(exc).__name__}: {first}"
    return module, ""


def extension() -> Any:
    """The compiled shim (built on first use), or ``None`` where it is unavailable."""
    return _load()[0]


def unavailable() -> str:
    """Why the shim cannot be used here, or ``""`` where it can (builds it on first use)."""
    return _load()[1]
