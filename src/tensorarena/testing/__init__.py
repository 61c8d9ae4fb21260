"""Test doubles users can run their own code against: :mod:`tensorarena.testing.cuda`, a strict
simulated CUDA runtime (no GPU needed), swapped in with one ``with`` statement."""

__all__: list[str] = []
