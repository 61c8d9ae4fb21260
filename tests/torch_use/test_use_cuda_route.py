"""``use(device="cuda")`` wired to torch's MemPool route on the simulated CUDA runtime: torch
here has no CUDA, so ``torch.cuda``'s three calls it makes are stood in for, and the test checks
what tensorarena does around them (the pluggable allocator itself: tests/interop)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tensorarena.errors import ShimUnavailableError, UnsupportedError  # noqa: E402
from tensorarena.interop.stream_pools import stream_ordered_pool  # noqa: E402
from tensorarena.interop.torch_allocator import TorchAllocator, build_shim  # noqa: E402
from tensorarena.testing.cuda import simulated  # noqa: E402
from tensorarena.torch import use  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[list[tuple[str, Any]]]:
    try:
        monkeypatch.setenv("TENSORARENA_TORCH_SHIM", str(build_shim(tmp_path)))
    except ShimUnavailableError as exc:  # pragma: no cover - a machine without a C compiler
        pytest.skip(f"cannot build the pluggable allocator's shim here: {exc}")
    calls: list[tuple[str, Any]] = []

    @contextlib.contextmanager
    def use_mem_pool(pool: Any, device: Any = None) -> Iterator[None]:
        calls.append(("enter", device))
        yield
        calls.append(("exit", device))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "use_mem_pool", use_mem_pool)
    monkeypatch.setattr(TorchAllocator, "mem_pool", lambda self: "a MemPool")
    with simulated(devices=2, memory="4MiB", seed=3):
        yield calls


def test_a_cuda_route_enters_and_leaves_torchs_mem_pool_on_its_device(
        fake_cuda: list[tuple[str, Any]]) -> None:
    with use(device="cuda") as route:
        assert route.device == "cuda:1" and route.threads == "calling"
        assert route.resource is stream_ordered_pool(1)
        with pytest.raises(UnsupportedError, match="one CUDA route at a time"):
            use(device="cuda:0")
    assert fake_cuda == [("enter", 1), ("exit", 1)] and not route.installed


def test_every_thread_is_refused_on_cuda(fake_cuda: list[tuple[str, Any]]) -> None:
    with pytest.raises(UnsupportedError, match="calling"):
        use(device="cuda:0", threads="all")
    assert fake_cuda == []
