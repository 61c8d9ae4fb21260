"""Shared test set-up. Its directory (``tests/``) is on ``sys.path`` (pytest's prepend import
mode), so every test module can import the small shared helpers here, e.g. ``_upstreams``.

The ``shim`` fixture is the tests' of ``tensorarena.torch`` (``use`` and ``learned``): torch's CPU
allocator shim, compiled once per machine (cached under ~/.cache/tensorarena), or every test that
needs it skipped, saying why."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def shim() -> Any:
    pytest.importorskip("torch")
    from tensorarena.interop import torch_cpu_shim

    reason = torch_cpu_shim.unavailable()
    if reason:
        pytest.skip(f"torch's CPU allocator shim cannot be built here: {reason}")
    return torch_cpu_shim.extension()
