"""Thin ctypes bindings to the Linux calls behind host memory: mmap, munmap, madvise, mlock, mbind.

This is the only module that talks to libc. Each wrapper raises :class:`OSError` with the real
``errno`` on failure (callers turn that into a tensorarena error with the numbers a user needs).
Addresses are plain ints. Nothing here keeps state except the lazily loaded library handle.

``mbind`` and ``get_mempolicy`` have no libc wrapper without libnuma, so they go through
``syscall(2)`` with the number for this architecture.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from functools import cache

__all__ = [
    "MADV_DONTNEED",
    "MADV_HUGEPAGE",
    "MPOL_BIND",
    "MPOL_DEFAULT",
    "MPOL_PREFERRED",
    "PAGE_SIZE",
    "available",
    "get_mempolicy",
    "madvise",
    "malloc_trim",
    "mbind",
    "mlock",
    "mmap_anonymous",
    "munlock",
    "munmap",
    "page_node",
    "sched_getcpu",
]

PAGE_SIZE: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_PROT_READ_WRITE = 0x1 | 0x2
_MAP_PRIVATE = 0x02
_MAP_ANONYMOUS = 0x20
_MAP_FAILED = ctypes.c_void_p(-1).value

MADV_DONTNEED = 4
MADV_HUGEPAGE = 14

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
_MPOL_F_NODE = 1 << 0
_MPOL_F_ADDR = 1 << 1

#: (mbind, get_mempolicy) syscall numbers per architecture.
_SYSCALLS: dict[str, tuple[int, int]] = {
    "x86_64": (237, 239),
    "amd64": (237, 239),
    "aarch64": (235, 236),
    "arm64": (235, 236),
}

#: Bits in the node masks we pass; enough for any real machine (the kernel wants a multiple of 64).
_MAX_NODES = 1024
_MASK_WORDS = _MAX_NODES // 64


def available() -> bool:
    """True on Linux, where these bindings work."""
    return sys.platform.startswith("linux")


@cache
def _libc() -> ctypes.CDLL:
    if not available():
        raise OSError(f"host memory bindings need Linux, not {sys.platform}")
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
    ]
    for name in ("munmap", "mlock", "munlock"):
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.madvise.restype = ctypes.c_int
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.syscall.restype = ctypes.c_long
    lib.sched_getcpu.restype = ctypes.c_int
    lib.sched_getcpu.argtypes = []
    return lib


def _raise_errno(call: str, address: int | None = None) -> None:
    err = ctypes.get_errno()
    where = f" at {address:#x}" if address is not None else ""
    raise OSError(err, f"{call}{where}: {os.strerror(err)}")


def mmap_anonymous(nbytes: int) -> int:
    """Map ``nbytes`` (a multiple of the page size) of private anonymous memory; return its address.

    The pages are not backed until first touched, so a mapping costs address space, not RAM.
    """
    address = _libc().mmap(None, nbytes, _PROT_READ_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
    if address is None or address == _MAP_FAILED:
        _raise_errno(f"mmap({nbytes})")
    return int(address)


def munmap(address: int, nbytes: int) -> None:
    """Unmap ``[address, address + nbytes)``; its pages go back to the kernel at once."""
    if _libc().munmap(address, nbytes) != 0:
        _raise_errno(f"munmap({nbytes})", address)


def madvise(address: int, nbytes: int, advice: int) -> None:
    """Give the kernel ``advice`` (``MADV_*``) about a mapped range."""
    if _libc().madvise(address, nbytes, advice) != 0:
        _raise_errno(f"madvise({advice})", address)


def malloc_trim() -> bool:
    """Ask the C library's heap to give its free pages back to the kernel (glibc's
    ``malloc_trim(0)``, where torch's CPU tensors and every C extension's small allocations
    live); return whether it released any. False where the C library has no such call (musl)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.restype = ctypes.c_int
    trim.argtypes = [ctypes.c_size_t]
    return bool(trim(0))


def mlock(address: int, nbytes: int) -> None:
    """Lock the pages of a range in RAM (faulting them in): they can no longer be swapped out."""
    if _libc().mlock(address, nbytes) != 0:
        _raise_errno(f"mlock({nbytes})", address)


def munlock(address: int, nbytes: int) -> None:
    """Undo :func:`mlock` for a range."""
    if _libc().munlock(address, nbytes) != 0:
        _raise_errno(f"munlock({nbytes})", address)


NodeSet = frozenset[int] | set[int] | list[int]


def _syscall_numbers() -> tuple[int, int]:
    machine = platform.machine().lower()
    try:
        return _SYSCALLS[machine]
    except KeyError:
        raise OSError(f"mbind/get_mempolicy syscall numbers unknown for {machine!r}") from None


def _node_mask(nodes: NodeSet) -> ctypes.Array[ctypes.c_ulong]:
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    for node in nodes:
        if not 0 <= node < _MAX_NODES:
            raise OSError(f"NUMA node {node} is outside [0, {_MAX_NODES})")
        mask[node // 64] |= 1 << (node % 64)
    return mask


def mbind(address: int, nbytes: int, mode: int, nodes: NodeSet) -> None:
    """Set the NUMA memory policy ``mode`` (``MPOL_*``) over ``nodes`` for a page-aligned range.

    Pages not yet touched will be allocated according to the policy when first touched.
    """
    mask = _node_mask(nodes) if mode != MPOL_DEFAULT else None
    maxnode = _MAX_NODES + 1 if mask is not None else 0
    number = _syscall_numbers()[0]
    result = _libc().syscall(
        ctypes.c_long(number),
        ctypes.c_void_p(address),
        ctypes.c_ulong(nbytes),
        ctypes.c_int(mode),
        mask,
        ctypes.c_ulong(maxnode),
        ctypes.c_uint(0),
    )
    if result != 0:
        _raise_errno(f"mbind(mode={mode}, nodes={sorted(nodes)})", address)


def get_mempolicy(address: int) -> tuple[int, frozenset[int]]:
    """The memory policy of the mapping containing ``address``: ``(mode, nodes)``."""
    mode = ctypes.c_int(-1)
    mask = (ctypes.c_ulong * _MASK_WORDS)()
    number = _syscall_numbers()[1]
    result = _libc().syscall(
        ctypes.c_long(number),
        ctypes.byref(mode),
        mask,
        ctypes.c_ulong(_MAX_NODES),
        ctypes.c_void_p(address),
        ctypes.c_ulong(_MPOL_F_ADDR),
    )
    if result != 0:
        _raise_errno("get_mempolicy", address)
    nodes = frozenset(
        word * 64 + bit for word in range(_MASK_WORDS) for bit in range(64) if mask[word] >> bit & 1
    )
    return mode.value, nodes


def page_node(address: int) -> int:
    """The NUMA node holding the page at ``address`` (the kernel faults it in if needed)."""
    node = ctypes.c_int(-1)
    number = _syscall_numbers()[1]
    result = _libc().syscall(
        ctypes.c_long(number),
        ctypes.byref(node),
        None,
        ctypes.c_ulong(0),
        ctypes.c_void_p(address),
        ctypes.c_ulong(_MPOL_F_NODE | _MPOL_F_ADDR),
    )
    if result != 0:
        _raise_errno("get_mempolicy(MPOL_F_NODE)", address)
    return node.value


def sched_getcpu() -> int:
    """The CPU the calling thread is running on now (libc, else ``/proc/self/stat`` field 39)."""
    try:
        cpu = int(_libc().sched_getcpu())
    except (OSError, AttributeError):
        cpu = -1
    if cpu >= 0:
        return cpu
    with open("/proc/thread-self/stat", encoding="ascii") as stat:
        # The command name (field 2) may contain spaces; fields after the closing ')' are plain.
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[39 - 3])
