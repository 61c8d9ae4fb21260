"""Allocation sites: the Python stack of the code that called into tensorarena, captured cheaply.

The debugging adaptors (``Tracking``, ``Guarded``, ``Poisoning``) name *where* a block was
allocated or freed. The site that matters is the user's code, not ours: ``ta.empty`` ->
``Allocation`` -> ``Tracking.allocate`` -> ``Pool.allocate`` is the same site for every array, so
:func:`capture` skips every frame inside the ``tensorarena`` package (the benchmarks and the
command line included) and keeps up to ``depth`` frames from the first one outside it.

Cost (why it is opt-in where it can be): ``sys._getframe`` and a walk of ``f_back`` pointers,
with the "is this frame ours?" answer cached per file name, costs well under a microsecond for one
frame and a fraction of that for each further one (``bench/RESULTS.md``);
``traceback.extract_stack`` costs an order of magnitude more because it reads source lines. A frame
is kept as ``(filename, line, function)``, which is what PyTorch's memory snapshots call a frame;
nothing is formatted until a report asks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

__all__ = [
    "Frame",
    "Stack",
    "as_frames",
    "capture",
    "format_site",
    "format_stack",
    "is_tensorarena_file",
]

Frame = tuple[str, int, str]
"""``(filename, line, function)``: one frame of an allocation site."""

Stack = tuple[Frame, ...]
"""Innermost frame first; empty when stacks were off."""

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# filename -> is it inside the tensorarena package? Keyed by the filename, whose hash the string
# caches, not by the code object, whose hash is recomputed from its contents every time.
_ours: dict[str, bool] = {}


def _is_ours(filename: str) -> bool:
    known = _ours.get(filename)
    if known is None:
        known = os.path.abspath(filename).startswith(_PACKAGE)
        if len(_ours) > 65536:  # exec'd code with made-up names could grow it without bound
            _ours.clear()
        _ours[filename] = known
    return known


def is_tensorarena_file(filename: str) -> bool:
    """Whether ``filename`` (a code object's) is inside the tensorarena package (cached)."""
    return _is_ours(filename)


def capture(depth: int) -> Stack:
    """Up to ``depth`` frames of the caller's stack, starting at the first frame outside
    tensorarena (innermost first). ``depth`` 0 returns ``()`` at once."""
    if depth <= 0:
        return ()
    frame = sys._getframe(1)
    while frame is not None and _is_ours(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
    frames: list[Frame] = []
    while frame is not None and len(frames) < depth:
        code = frame.f_code
        frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back  # type: ignore[assignment]
    return tuple(frames)


def _short(filename: str) -> str:
    """A path relative to the working directory when it lies under it (shorter reports)."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        return filename
    return filename if relative.startswith("..") else relative


def format_site(stack: Stack) -> str:
    """The innermost frame as ``file.py:12 in function``; ``"<unknown site>"`` without one."""
    if not stack:
        return "<unknown site>"
    filename, line, function = stack[0]
    return f"{_short(filename)}:{line} in {function}"


def format_stack(stack: Stack, *, indent: str = "  ") -> str:
    """Every frame on its own line, innermost first (as a traceback read bottom-up)."""
    if not stack:
        return f"{indent}<unknown site: stacks were off (stack_depth=0)>"
    return "\n".join(f"{indent}{format_site((frame,))}" for frame in stack)


def as_frames(stack: Iterable[Frame]) -> list[dict[str, object]]:
    """PyTorch's snapshot frame dicts (``filename``, ``line``, ``name``), innermost first."""
    return [{"filename": f, "line": n, "name": name} for f, n, name in stack]
