"""Shared set-up of the tests of ``tensorarena.torch.use``: the shim, compiled once per machine
(cached under ~/.cache/tensorarena), or every test that needs it skipped, saying why."""

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
