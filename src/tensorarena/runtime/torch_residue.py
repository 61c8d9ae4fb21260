"""What building a program would leave in torch's process-wide caches, taken out again.

Two of torch's caches outlive any program that fills them:

* FX keeps the Python source of every ``GraphModule``'s ``forward`` for the process (in
  ``torch.fx.graph_module._loader`` and a lazy ``linecache`` entry, for tracebacks): each
  module a build makes (the exported program's, the reordered copy, ``ep.module()``, the
  export's own) left its source there, 58 KiB each for GPT-2 124M, after the program was
  deleted. The modules still run without it: only a traceback through their ``forward`` shows
  no source line;
* ``FakeTensorMode``'s dispatch cache (a class attribute) keeps an entry per operator and input
  metadata that a fake propagation (the export, the read-back program's views) ran.

:func:`caches_as_they_were` drops the entries of both added while a program is built (those
already there, such as ``torch.compile``'s, stay); modules made later (an order chosen again
at the first call, ``verify``'s reference) drop theirs with :func:`forget_source`.
"""

from __future__ import annotations

import linecache
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["caches_as_they_were", "forget_source"]

#: The file name FX gives the source of a module's ``forward`` (``<eval_with_key>.N``).
FX_KEY = "<eval_with_key>"


def forget_source(module: Any) -> None:
    """Drop the source FX keeps of ``module``'s ``forward`` and of every submodule's (a
    ``GraphModule`` this package made); anything else is left as it is."""
    try:
        from torch.fx.graph_module import _loader
    except ImportError:  # another torch: nothing of ours is kept there
        return
    cache = getattr(_loader, "eval_cache", None)
    modules = module.modules() if callable(getattr(module, "modules", None)) else ()
    for each in modules:
        code = getattr(getattr(type(each).__dict__.get("forward"), "__code__", None),
                       "co_filename", "")
        if not code.startswith(FX_KEY):
            continue
        if isinstance(cache, dict):
            cache.pop(code, None)
        linecache.cache.pop(code, None)


@contextmanager
def caches_as_they_were() -> Iterator[None]:
    """Within: torch runs as usual; on leaving (raised or not), the entries added meanwhile to
    FX's source cache and ``FakeTensorMode``'s dispatch cache are dropped (module docstring;
    entries that were there before, such as ``torch.compile``'s, stay)."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.graph_module import _loader
    except ImportError:  # another torch: its caches are not known here
        yield
        return
    caches = [c for c in (getattr(FakeTensorMode, "cache", None),
                          getattr(_loader, "eval_cache", None)) if isinstance(c, dict)]
    before = [set(cache) for cache in caches]
    try:
        yield
    finally:
        for cache, kept in zip(caches, before, strict=True):
            for key in [key for key in cache if key not in kept]:
                del cache[key]
                if isinstance(key, str) and key.startswith(FX_KEY):
                    linecache.cache.pop(key, None)
