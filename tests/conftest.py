"""Shared test set-up. Its directory (``tests/``) is on ``sys.path`` (pytest's prepend import
mode), so every test module can import the small shared helpers here, e.g. ``_upstreams``."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # Until pyproject.toml's marker list has it (--strict-markers refuses unknown marks).
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with the reason without)")
