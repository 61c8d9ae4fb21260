"""Fixtures shared by the array-owner tests."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture
def no_unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail on any exception raised inside an owner's ``__del__`` (a double free is one).

    Opt in with ``pytestmark = pytest.mark.usefixtures("no_unraisable")``."""
    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: seen.append(repr(hook.exc_value)))
    yield seen
    gc.collect()
    assert seen == [], seen
