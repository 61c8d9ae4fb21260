"""Atomic file writes: a temporary file in the target's folder, then one rename.

A recording that is interrupted (Ctrl-C, a crash, a full disk) must never leave a truncated trace
under the final name, where a later replay would read it as complete. Every writer of this
package writes through :func:`atomic_text` or :func:`atomic_binary`: the bytes go to a hidden
temporary file next to the target (same file system, so the rename is atomic), are flushed and
fsync'd, and only then ``os.replace`` puts them under the final name. On any exception the
temporary file is removed and the target is untouched (an older file of that name stays).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_binary", "atomic_text", "check_writable"]


@contextlib.contextmanager
def atomic_text(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """A UTF-8 text file (``newline=""``, for csv) that appears at ``path`` only on success."""
    with _temporary(Path(path)) as (descriptor, _), \
            os.fdopen(descriptor, "w", encoding="utf-8", newline="") as handle:
        yield handle
        _sync(handle)


@contextlib.contextmanager
def atomic_binary(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` only if the ``with`` block succeeds."""
    with _temporary(Path(path)) as (descriptor, _), os.fdopen(descriptor, "wb") as handle:
        yield handle
        _sync(handle)


def _sync(handle: IO[str] | IO[bytes]) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise the ``OSError`` an atomic write to ``path`` would raise (a directory, a missing
    folder, no permission), by making and removing its temporary file: for callers that would
    otherwise find out only after a long recording."""
    descriptor, temporary = _make_temporary(Path(path))
    os.close(descriptor)
    os.unlink(temporary)


def _make_temporary(target: Path) -> tuple[int, str]:
    if target.is_dir():  # else the rename fails after the whole file was written, naming both
        raise IsADirectoryError(errno.EISDIR, "cannot write a file over a directory", str(target))
    return tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)


@contextlib.contextmanager
def _temporary(target: Path) -> Iterator[tuple[int, str]]:
    """A temporary file next to ``target``, renamed onto it after the block, removed on error."""
    descriptor, temporary = _make_temporary(target)
    try:
        yield descriptor, temporary
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a trace is an ordinary file
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
