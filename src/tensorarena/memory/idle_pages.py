"""Give the pages of memory nothing needs back to the kernel, keeping the range mapped.

A planned program keeps its arena between calls: the next call's intermediates go to the same
addresses, with the code generated over them. Nothing in it is read before it is written again
(a call writes every slot before reading it; ``poison=True`` checks it), so between calls its
bytes are idle. :func:`release_idle_pages` hands the pages of such a range back
(``madvise(MADV_DONTNEED)``): resident memory drops at once, the addresses stay valid, and the
next touch of a page maps a zeroed one (a page fault, where a fresh allocation would cost the
same).

Only where that is what happens: the range must lie in private anonymous mappings (``rw-p``
with no file or device behind them in ``/proc/self/maps``). A shared mapping would keep its
data (and another process may read it), a file's pages would be read back from the file, a
device's (pinned host memory, a GPU's mapping) are not the kernel's to drop, and a locked range
refuses (``EINVAL``): each gives back nothing. Only the whole pages inside the range go: a
page shared with bytes outside it stays.
"""

from __future__ import annotations

import operator
import sys

from tensorarena.errors import InvalidArgumentError
from tensorarena.memory import libc

__all__ = ["PAGE", "private_anonymous", "release_idle_pages"]

PAGE = libc.PAGE_SIZE  #: the kernel's page size: what ``madvise`` gives back whole


def release_idle_pages(address: int, nbytes: int) -> int:
    """Give back the whole pages of ``[address, address + nbytes)`` to the kernel, if the range
    is private anonymous memory (module docstring); return the bytes given back (0 where the
    range is anything else, or where the platform has no ``madvise``). The caller promises
    nothing reads those bytes before writing them: they read as zeros afterwards."""
    address, nbytes = _checked(address, nbytes)
    start = -(-address // PAGE) * PAGE
    end = (address + nbytes) // PAGE * PAGE
    if end <= start or not libc.available() or not private_anonymous(start, end - start):
        return 0
    try:
        libc.madvise(start, end - start, libc.MADV_DONTNEED)
    except OSError:  # a locked range (EINVAL), or mapped differently since it was read
        return 0
    return end - start


def private_anonymous(address: int, nbytes: int) -> bool:
    """Whether every byte of ``[address, address + nbytes)`` lies in private anonymous
    mappings, as ``/proc/self/maps`` lists them (False off Linux)."""
    address, nbytes = _checked(address, nbytes)
    if not sys.platform.startswith("linux"):
        return False
    covered, end = address, address + nbytes
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                low, high, perms, name = _mapping(line)
                if high <= covered:
                    continue
                if low > covered:
                    return False  # a hole: not mapped at all
                if perms[:2] != "rw" or perms[3] != "p" or (name and not name.startswith("[anon")):
                    return False
                covered = high
                if covered >= end:
                    return True
    except OSError:
        return False
    return covered >= end


def _mapping(line: str) -> tuple[int, int, str, str]:
    fields = line.split(maxsplit=5)
    low, _, high = fields[0].partition("-")
    return int(low, 16), int(high, 16), fields[1], fields[5].strip() if len(fields) > 5 else ""


def _checked(address: int, nbytes: int) -> tuple[int, int]:
    try:
        address, nbytes = operator.index(address), operator.index(nbytes)
    except TypeError:
        raise InvalidArgumentError(
            f"address and nbytes must be integers, got {type(address).__name__} and "
            f"{type(nbytes).__name__}") from None
    if address <= 0 or nbytes < 0:
        raise InvalidArgumentError(
            f"need a positive address and a size >= 0, got {address:#x} and {nbytes}")
    return address, nbytes
