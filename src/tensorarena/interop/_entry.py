"""``empty``'s compiled entry: the public ``tensorarena.empty`` of the compiled build.

In the compiled build, :func:`tensorarena.interop.empty` is a C object (``FastEmpty`` of
``_native_empty.c``) in front of the Python function :func:`tensorarena.interop.arrays.empty`. It
makes the calls model code repeats itself: ``empty(n, dtype)`` (a 1-d NumPy array of a plain
dtype) and ``empty(n, dtype, like="torch")`` (a dtype argument whose route is DLPack, see
:mod:`tensorarena.interop._torch_route`), with an int ``n``, a dtype an earlier call resolved,
the default resource and alignment, outside any :func:`~tensorarena.interop.scope`; it does what
the Python function does on those paths, in C. Every other call goes to the Python function with
its arguments as they came, so errors, scopes, n-d shapes and explicit resources behave exactly
as there.

Why: in a loop that also runs torch, torch's code evicts ours from the instruction cache at every
iteration, and the compiled Python function spans several times the cache lines of this path
(``bench/RESULTS.md`` has the misses and times). The entry carries the function's ``__doc__``,
``__name__``, ``__module__`` and ``__wrapped__``, as ``functools.lru_cache``'s C wrapper does,
and the docstring of its source (mypyc drops docstrings: ``help(tensorarena.empty)`` had nothing
to show in the compiled build). The pure build has no such object: ``empty`` is the function.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

from tensorarena.interop import default, scope
from tensorarena.interop._torch_route import ROUTES
from tensorarena.memory.resource import DEFAULT_ALIGNMENT
from tensorarena.sizes import MAX_SIZE

__all__ = ["compiled_entry", "source_docstring"]

Function = TypeVar("Function", bound=Callable[..., Any])


def compiled_entry(general: Function) -> Function:
    """``general`` (the Python ``empty``) behind its compiled entry, or itself in the pure
    build."""
    try:
        from tensorarena.interop._native_empty import FastEmpty
    except ImportError:  # the pure build
        return general
    from tensorarena.interop.arrays import DTYPES
    from tensorarena.interop.owner import native_owner

    # NumPy arrays over the native owner, where it was built (else they stay the function's).
    numpy: dict[str, Any] = {}
    if native_owner is not None:
        numpy = {"dtypes": DTYPES, "owner": native_owner, "frombuffer": np.frombuffer}
    entry = FastEmpty(
        general, ROUTES, scope._current, vars(default), DEFAULT_ALIGNMENT, MAX_SIZE,
        default_dtype=np.float32,  # empty's default dtype argument (a test checks they agree)
        **numpy,
    )  # fmt: skip
    functools.update_wrapper(entry, general)
    entry.__module__ = "tensorarena.interop"  # where users find it (the function is in arrays)
    if entry.__doc__ is None:
        entry.__doc__ = source_docstring(general)
    return cast(Function, entry)


def source_docstring(function: Callable[..., Any]) -> str | None:
    """The docstring of ``function`` as written in its module's ``.py`` file (installed beside
    the compiled module), or ``None`` where that file or function is not found."""
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file)
    try:
        source = path.with_name(path.name.split(".")[0] + ".py")
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function.__name__:
            return ast.get_docstring(node)
    return None

