"""What a block is labelled and grouped by in the timeline: the line of the program that made it.

A trace event's ``site`` is its Python stack, innermost first (``model.py:12 in forward; ...``).
The innermost frame is often a library's (``torch/nn/functional.py:2100 in linear``, which every
linear layer shares); the line a user reads is the first frame *outside* the libraries, so
:func:`site_label` picks that one, falling back to the innermost frame when every frame is a
library's, and to the event's ``tag`` (the op) when there is no stack.

A frame is a library's when its file lies under the interpreter's standard library or
site-packages (``sysconfig``), under any ``site-packages``/``dist-packages`` folder, is frozen or
synthetic (``<frozen runpy>``, ``<string>``), or — PyTorch's profiler names files relative to
their ``sys.path`` entry (``torch/nn/functional.py``) — its first path component is a top-level
module installed there. Answers are cached per file name. A label names its file relative to
its ``sys.path`` entry, as the profiler does (``model.py:12 in forward``).
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig

from tensorarena.trace import SITE_SEPARATOR
from tensorarena.trace.pool_recorder import short_path

__all__ = ["is_library_file", "site_label"]

_NO_SITE = "<no site recorded>"
_ROOTS = tuple(sorted({os.path.abspath(p) + os.sep for key in ("stdlib", "platstdlib",
                                                               "purelib", "platlib")
                       if (p := sysconfig.get_paths().get(key))}))
_known: dict[str, bool] = {}


def _installed(top: str) -> bool:
    """Whether the top-level module ``top`` is installed under the library roots."""
    if not top.isidentifier():
        return False
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = (spec.origin or "") if spec is not None else ""
    if spec is not None and not origin and spec.submodule_search_locations:
        origin = next(iter(spec.submodule_search_locations), "")
    return bool(origin) and os.path.abspath(origin).startswith(_ROOTS)


def is_library_file(filename: str) -> bool:
    """Whether a frame of ``filename`` is a library's, not the program's (see the module
    docstring)."""
    known = _known.get(filename)
    if known is None:
        parts = filename.replace("\\", "/").split("/")
        if filename.startswith("<") or "site-packages" in parts or "dist-packages" in parts:
            known = True
        elif os.path.isabs(filename):
            known = os.path.abspath(filename).startswith(_ROOTS)
        else:
            known = len(parts) > 1 and _installed(parts[0])
        if len(_known) > 65536:
            _known.clear()
        _known[filename] = known
    return known


def site_label(site: str, tag: str = "") -> str:
    """The label of an event with Python stack ``site`` and op ``tag`` (see the docstring)."""
    if not site:
        return tag or _NO_SITE
    frames = site.split(SITE_SEPARATOR)
    chosen = frames[0]
    for frame in frames:
        if not is_library_file(frame.rpartition(" in ")[0].rpartition(":")[0]):
            chosen = frame
            break
    filename, colon, rest = chosen.rpartition(" in ")[0].rpartition(":")[0], ":", \
        chosen[len(chosen.rpartition(" in ")[0].rpartition(":")[0]) + 1:]
    return f"{short_path(filename)}{colon}{rest}" if filename else chosen
