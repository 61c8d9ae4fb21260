"""Where a test's own lines are, for asserting the sites that the debugging adaptors report."""

from __future__ import annotations


def line_of(path: str, marker: str) -> int:
    """The number of the first line of ``path`` that holds ``marker`` (a comment such as
    ``# LEAK SITE`` on the line a test allocates on), not counting calls of this function."""
    with open(path, encoding="utf-8") as source:
        for number, line in enumerate(source, 1):
            if marker in line and "line_of(" not in line:
                return number
    raise AssertionError(f"{marker!r} is not in {path}")
