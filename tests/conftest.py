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


@pytest.fixture(autouse=True, scope="session")
def _exports_in_this_process() -> Any:
    """Programs built by the tests export in the test process: the child process that keeps
    torch.export's imports out of a user's process (``runtime.export_process``) costs a save
    and a load per export, minutes over the suite. ``tests/runtime/test_export_process.py``
    tests the child; ``TENSORARENA_TEST_ISOLATED_EXPORT=1`` runs every test with it."""
    import os

    if os.environ.get("TENSORARENA_TEST_ISOLATED_EXPORT") == "1":
        yield
        return
    try:
        from tensorarena.runtime import exporting
    except ImportError:  # pragma: no cover - runtime needs nothing optional to import
        yield
        return
    was = exporting.ISOLATE_BY_DEFAULT
    exporting.ISOLATE_BY_DEFAULT = False
    yield
    exporting.ISOLATE_BY_DEFAULT = was
