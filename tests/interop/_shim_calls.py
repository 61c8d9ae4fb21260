"""The C entry points of the pluggable allocator's shim, typed for ctypes."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any


def c_calls(path: Path) -> Any:
    """``ta_malloc``/``ta_free`` of the shim built at ``path``."""
    lib = ctypes.CDLL(str(path))
    lib.ta_malloc.restype = ctypes.c_void_p
    lib.ta_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.ta_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return lib
