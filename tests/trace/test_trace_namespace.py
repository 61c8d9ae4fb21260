"""The trace namespace: every exported name documented, nothing heavy imported, errors in the
one tree, and the layering (trace may not import report or the command line)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import tensorarena.trace as trace
from tensorarena.errors import TensorArenaError


def test_every_exported_name_exists_and_is_documented() -> None:
    assert trace.__doc__
    assert len(set(trace.__all__)) == len(trace.__all__)
    for name in trace.__all__:
        value = getattr(trace, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__doc__, name


def test_errors_belong_to_the_one_tree() -> None:
    assert issubclass(trace.MalformedTraceError, TensorArenaError)
    assert issubclass(trace.MalformedTraceError, ValueError)
    assert issubclass(trace.UnsafePickleError, trace.MalformedTraceError)


def test_importing_the_trace_layer_needs_only_numpy() -> None:
    code = ("import sys, tensorarena.trace, tensorarena.adaptors.logging; "
            "heavy = {'torch', 'transformers', 'rich', 'matplotlib'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
