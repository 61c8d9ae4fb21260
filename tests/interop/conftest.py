"""Fixtures shared by the interop tests: the array owners' and the allocator shim's."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorarena.errors import ShimUnavailableError
from tensorarena.interop.torch_allocator import build_shim


@pytest.fixture
def no_unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail on any exception raised inside an owner's ``__del__`` (a double free is one).

    Opt in with ``pytestmark = pytest.mark.usefixtures("no_unraisable")``."""
    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: seen.append(repr(hook.exc_value)))
    yield seen
    gc.collect()
    assert seen == [], seen


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pluggable allocator's C shim, compiled once per module (skipped without a compiler)."""
    try:
        return build_shim(tmp_path_factory.mktemp("shim"))
    except ShimUnavailableError as exc:  # pragma: no cover - a machine without a C compiler
        pytest.skip(f"cannot build the shim here: {exc}")
