"""Shared test set-up. Its directory (``tests/``) is on ``sys.path`` (pytest's prepend import
mode), so every test module can import the small shared helpers here, e.g. ``_upstreams``."""

