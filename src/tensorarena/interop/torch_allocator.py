"""PyTorch's own CUDA allocations routed through a tensorarena pool (a pluggable allocator).

PyTorch lets a program replace its CUDA caching allocator, or serve one ``torch.cuda.MemPool``,
with ``torch.cuda.memory.CUDAPluggableAllocator(path, alloc_name, free_name)``: but it insists on
a *shared library* exporting two C functions. tensorarena ships the smallest such library as C
source (``_torch_alloc_shim.c``, 40 lines, no Python or CUDA headers): its two functions call
back into Python through ctypes function pointers, where :class:`TorchAllocator` takes each
block from a tensorarena resource. It is compiled with any C compiler:

* at install, when a compiler is present (``setup.py``'s build hook), into
  the package folder;
* or on demand with :func:`build_shim` (into ``~/.cache/tensorarena`` by default), which
  ``scripts/gpu_check.sh`` does;
* or wherever ``$TENSORARENA_TORCH_SHIM`` points.

Without it, :class:`TorchAllocator` raises :class:`~tensorarena.errors.ShimUnavailableError`
saying how to build it. The default resource per device is the device's stream-ordered pool
(:func:`~tensorarena.interop.stream_pools.stream_ordered_pool`), since PyTorch frees a tensor's
block as soon as Python drops it, while kernels using it may still run: stream order makes reuse
safe. PyTorch frees a block with the device and stream it was allocated on, without switching
device: the free runs with that device current (CUDA records an event only on its own device's
streams). What this route cannot see: PyTorch's pluggable-allocator interface has no
``record_stream`` hook, so a tensor used on a second stream (``tensor.record_stream(s)``) is
reused after its *allocation* stream's work only; call
:meth:`~tensorarena.adaptors.StreamOrdered.record_stream` on the resource yourself for those.

A failing allocation returns NULL. Inside :meth:`TorchAllocator.mem_pool` PyTorch turns it into
its own ``torch.OutOfMemoryError`` (the cause is kept in :attr:`TorchAllocator.last_error`); the
process-wide replacement (``change_current_allocator``) does not check, and would hand out a
tensor at address 0, so :meth:`TorchAllocator.install` is refused.

Only one TorchAllocator can be installed in a process at a time (the shim has one pair of
callbacks); at interpreter exit the callbacks are cleared, so frees PyTorch makes during its own
shutdown do not call into a finalised interpreter.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError, ShimUnavailableError, UnsupportedError
from tensorarena.memory.cuda.current import block_device
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, check_resource

__all__ = [
    "SHIM_NAME",
    "TorchAllocator",
    "build_shim",
    "find_shim",
    "shim_source",
]

#: The shared library's file name.
SHIM_NAME = "libtensorarena_torch_alloc.so"
_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


def shim_source() -> Path:
    """The C source of the shim."""
    return Path(__file__).with_name("_torch_alloc_shim.c")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tensorarena"


def find_shim() -> Path | None:
    """The built shim: ``$TENSORARENA_TORCH_SHIM``, else beside this module (built at
    install), else in the cache folder (built by :func:`build_shim`); ``None`` if none is."""
    candidates = [
        os.environ.get("TENSORARENA_TORCH_SHIM"),
        str(Path(__file__).with_name(SHIM_NAME)),
        str(_cache_dir() / SHIM_NAME),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def build_shim(directory: str | os.PathLike[str] | None = None, *, compiler: str | None = None
               ) -> Path:
    """Compile the shim with a C compiler (``compiler``, ``$CC``, ``cc``, ``gcc`` or ``clang``)
    into ``directory`` (default: the cache folder); return the library's path.

    Raises :class:`~tensorarena.errors.ShimUnavailableError` when no compiler is found or the
    compilation fails (with the compiler's message).
    """
    cc = compiler or os.environ.get("CC") or next(
        (found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None
    )
    if not cc:
        raise ShimUnavailableError(
            "no C compiler found (tried $CC, cc, gcc, clang): PyTorch's pluggable allocator "
            "needs the tensorarena shim compiled; install one or point $TENSORARENA_TORCH_SHIM "
            "at a prebuilt " + SHIM_NAME
        )
    folder = Path(directory) if directory is not None else _cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / SHIM_NAME
    partial = folder / f".{SHIM_NAME}.{os.getpid()}"
    command = [cc, "-shared", "-fPIC", "-O2", "-o", str(partial), str(shim_source())]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ShimUnavailableError(f"could not run {cc}: {exc}") from exc
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ShimUnavailableError(
            f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[:500]}"
        )
    partial.replace(target)  # atomic: another process never loads a half-written library
    return target


ResourceSpec = MemoryResource | Callable[[int], MemoryResource] | None

_installed_lock = threading.Lock()
_installed: TorchAllocator | None = None


def _clear_callbacks(lib: Any) -> None:
    lib.ta_set_callbacks(_ALLOC(), _FREE())


class TorchAllocator:
    """Serves PyTorch's CUDA allocations from tensorarena resources through the shim.

    ``resource``: one resource for every device, a callable ``device -> resource``, or ``None``
    for each device's stream-ordered pool (``stream_ordered_pool(d)``).
    ``shim``: the library to load (default: :func:`find_shim`).
    """

    def __init__(self, resource: ResourceSpec = None, *, shim: str | os.PathLike[str] | None = None
                 ) -> None:
        if resource is not None and not (
            callable(getattr(resource, "allocate", None)) or callable(resource)
        ):
            raise InvalidArgumentError(
                f"resource must be a memory resource, a factory or None, not {resource!r}"
            )
        path = Path(shim) if shim is not None else find_shim()
        if path is None or not path.is_file():
            missing = f"no {SHIM_NAME} found" if path is None else f"{path} does not exist"
            raise ShimUnavailableError(
                f"the PyTorch allocator shim is not built ({missing}): call "
                "tensorarena.interop.torch_allocator.build_shim() once (needs a C compiler), "
                "or set $TENSORARENA_TORCH_SHIM to a built one"
            )
        self._path = path
        self._lib = ctypes.CDLL(str(path))
        self._spec = resource
        self._resources: dict[int, MemoryResource] = {}
        self._lock = threading.Lock()
        self._alloc_callback = _ALLOC(self._alloc)  # kept alive: C holds only the pointer
        self._free_callback = _FREE(self._free)
        self._pluggable: Any = None
        self.last_error: BaseException | None = None
        self.allocations = self.frees = self.failures = 0

    @property
    def path(self) -> Path:
        """The shim library in use."""
        return self._path

    # --- installing ----------------------------------------------------------------------------

    def activate(self) -> TorchAllocator:
        """Point the shim's callbacks at this allocator (done by every method below)."""
        global _installed
        with _installed_lock:
            if _installed is not self:
                self._lib.ta_set_callbacks(self._alloc_callback, self._free_callback)
                if _installed is None:
                    atexit.register(_clear_callbacks, self._lib)
                _installed = self
        return self

    def pluggable(self) -> Any:
        """The ``torch.cuda.memory.CUDAPluggableAllocator`` over the shim."""
        self.activate()
        if self._pluggable is None:
            torch = require("torch", extra="torch", feature="the PyTorch allocator hook")
            self._pluggable = torch.cuda.memory.CUDAPluggableAllocator(
                str(self._path), "ta_malloc", "ta_free"
            )
        return self._pluggable

    def mem_pool(self) -> Any:
        """A ``torch.cuda.MemPool`` served by this allocator: ``with
        torch.cuda.use_mem_pool(pool):`` routes the allocations made inside through it."""
        torch = require("torch", extra="torch", feature="the PyTorch allocator hook")
        return torch.cuda.MemPool(self.pluggable().allocator())

    def install(self) -> None:
        """Refused: PyTorch's process-wide pluggable allocator does not check the pointer it
        gets, so an exhausted pool would give a tensor at address 0. Use :meth:`mem_pool`
        (``with torch.cuda.use_mem_pool(allocator.mem_pool()):``), where a refusal is
        PyTorch's own ``torch.OutOfMemoryError``."""
        raise UnsupportedError(
            "TorchAllocator.install() is refused: torch's change_current_allocator route does "
            "not check for NULL, so an exhausted pool would hand out a tensor at address 0; "
            "use `with torch.cuda.use_mem_pool(allocator.mem_pool()):` instead"
        )

    # --- the callbacks -------------------------------------------------------------------------

    def resource(self, device: int) -> MemoryResource:
        """The resource serving ``device``."""
        found = self._resources.get(device)
        if found is not None:
            return found
        with self._lock:
            found = self._resources.get(device)
            if found is None:
                found = self._make(device)
                self._resources[device] = found
            return found

    def _make(self, device: int) -> MemoryResource:
        spec = self._spec
        if spec is None:
            from tensorarena.interop.stream_pools import stream_ordered_pool

            return stream_ordered_pool(device)
        if callable(getattr(spec, "allocate", None)) and not isinstance(spec, type):
            return check_resource(spec, name="resource")
        factory = cast(Callable[[int], MemoryResource], spec)
        return check_resource(factory(device), name="resource")

    def _alloc(self, size: int, device: int, stream: int | None) -> int | None:
        try:
            address = self.resource(device).allocate(max(size, 1), DEFAULT_ALIGNMENT, stream or 0)
        except BaseException as exc:  # C cannot take an exception: NULL is PyTorch's OOM
            self.last_error = exc
            self.failures += 1
            return None
        self.allocations += 1
        return address

    def _free(self, address: int | None, size: int, device: int, stream: int | None) -> None:
        if not address:
            return
        try:
            with block_device(device):
                self.resource(device).deallocate(address, max(size, 1), stream or 0)
            self.frees += 1
        except BaseException as exc:  # nowhere to raise to: kept for the caller to inspect
            self.last_error = exc
            self.failures += 1

    def __repr__(self) -> str:
        return (
            f"TorchAllocator({self._path.name}, allocations={self.allocations}, "
            f"frees={self.frees}, failures={self.failures})"
        )
