"""This process's memory as the system sees it: resident bytes now, and the most since a reset.

Linux keeps both in ``/proc/self/status``: ``VmRSS`` (resident now) and ``VmHWM`` (the high-water
mark of ``VmRSS``). Writing ``5`` to ``/proc/self/clear_refs`` resets the high-water mark to the
current resident size (Linux 4.0 and later), so ``reset_peak(); f(); peak_rss()`` is the most
memory the process held while ``f`` ran, whatever allocator held it: torch's, glibc's for Python
objects, tensorarena's arenas, code Inductor loaded. Elsewhere (no ``/proc``) every function here
returns None and the benchmark reports the numbers as unavailable.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["peak_rss", "reset_peak", "rss"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(key: str) -> int | None:
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    match = re.search(rf"^{key}:\s+(\d+) kB$", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def rss() -> int | None:
    """Bytes resident now (``VmRSS``), or None where the system does not say."""
    return _status_bytes("VmRSS")


def peak_rss() -> int | None:
    """The most bytes resident since the process started or :func:`reset_peak` (``VmHWM``)."""
    return _status_bytes("VmHWM")


def reset_peak() -> bool:
    """Reset :func:`peak_rss` to the resident size now; False where that cannot be done (then
    :func:`peak_rss` still counts from an earlier, higher point and must not be used)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    now, peak = rss(), peak_rss()
    # The reset took if the mark sits at the resident size (a page or two may have come since).
    return now is not None and peak is not None and peak - now <= 1 << 20
