"""Touching the bytes of blocks: pattern fills and checks, and page protection, for the debugging
adaptors (``Guarded``, ``Poisoning``) — the only adaptors that write into memory they hand out.

A fill is one ``memset``. A check (:func:`intact`) reads the range once (``ctypes.string_at``)
and compares it with a cached ``bytes`` of the pattern, which is a ``memcmp``: about as cheap
for a 3 KiB range as for a 64-byte red zone, most of it the ctypes call (``bytes.count`` is
several times slower; figures in ``bench/RESULTS.md``). Only a range found damaged is looked at
closely (:func:`differences`: how many bytes differ and where the first is, still with C-speed
``bytes`` methods, never a Python loop).

``mprotect`` is bound here rather than in :mod:`tensorarena.memory.libc` (the module that
otherwise owns every libc call) because the guard-page mode of ``Guarded`` is its only user and
that module belongs to the memory layer's owners; it follows the same conventions (``OSError``
with the real errno).
"""

from __future__ import annotations

import ctypes
import os
from functools import cache

from tensorarena.errors import InvalidArgumentError, NotHostAccessibleError
from tensorarena.memory.resource import MemoryResource
from tensorarena.memory_kind import memory_kind_of

__all__ = [
    "PAGE_SIZE",
    "PROT_NONE",
    "PROT_READ_WRITE",
    "check_pattern",
    "differences",
    "fill",
    "intact",
    "mprotect",
    "require_host_memory",
]

PAGE_SIZE: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROT_NONE = 0
PROT_READ_WRITE = 0x1 | 0x2


def require_host_memory(upstream: MemoryResource, adaptor: str) -> None:
    """Raise NotHostAccessibleError unless the CPU may write ``upstream``'s addresses."""
    kind = memory_kind_of(upstream)
    if kind is None or not kind.host_accessible:
        what = "does not declare its memory_kind" if kind is None else (
            f"hands out {kind.value} addresses (memory_kind={kind.name})")
        raise NotHostAccessibleError(
            f"{adaptor} writes patterns into the memory it hands out, but "
            f"{type(upstream).__name__} {what}: wrap a resource over host memory, "
            "e.g. Pool(HostMemory())"
        )


def check_pattern(pattern: object, *, name: str = "pattern") -> int:
    """A fill pattern: one byte value, ``0 <= pattern <= 255``."""
    if type(pattern) is not int or not 0 <= pattern <= 255:
        raise InvalidArgumentError(f"{name} must be a byte value 0..255, got {pattern!r}")
    return pattern


def fill(address: int, nbytes: int, pattern: int) -> None:
    """Write ``pattern`` into ``[address, address + nbytes)``."""
    if nbytes > 0:
        ctypes.memset(address, pattern, nbytes)


#: Expected contents of ranges up to this long are cached per (pattern, length).
_CACHED_LENGTH = 1 << 16
_expected: dict[tuple[int, int], bytes] = {}


def intact(address: int, nbytes: int, pattern: int) -> bool:
    """True when every byte of the range still holds ``pattern``."""
    if nbytes <= 0:
        return True
    expected = _expected.get((pattern, nbytes))
    if expected is None:
        expected = bytes((pattern,)) * nbytes
        if nbytes <= _CACHED_LENGTH:
            if len(_expected) > 4096:  # many distinct lengths: start again, stay bounded
                _expected.clear()
            _expected[pattern, nbytes] = expected
    return ctypes.string_at(address, nbytes) == expected


def differences(address: int, nbytes: int, pattern: int) -> tuple[int, int, int]:
    """``(count, first, last)`` of the bytes in the range that differ from ``pattern``
    (offsets from ``address``); ``(0, -1, -1)`` when the range is intact."""
    if nbytes <= 0:
        return 0, -1, -1
    data = ctypes.string_at(address, nbytes)
    byte = bytes((pattern,))
    count = nbytes - data.count(byte)
    if not count:
        return 0, -1, -1
    first = nbytes - len(data.lstrip(byte))
    last = len(data.rstrip(byte)) - 1
    return count, first, last


@cache
def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mprotect.restype = ctypes.c_int
    lib.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def mprotect(address: int, nbytes: int, protection: int) -> None:
    """Set the protection of the whole pages ``[address, address + nbytes)``."""
    if _libc().mprotect(address, nbytes, protection) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect({address:#x}, {nbytes}, {protection}): {os.strerror(err)}")
