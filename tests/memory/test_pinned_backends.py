"""Which pinning backend PinnedHostMemory uses, and that the mlock-only variant says what it is."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorarena.errors import MissingDependencyError, UnknownNameError
from tensorarena.memory import LockedHostMemory, MlockBackend, PinnedHostMemory
from tensorarena.memory.cuda import CudaHostAllocBackend, CudaRuntime, set_cuda_runtime
from tensorarena.testing.cuda import Simulator


@pytest.fixture
def cuda_runtime_is() -> Iterator[object]:
    """Set the process's CUDA runtime for one test, and put the previous one back."""
    previous = set_cuda_runtime(None)
    fakes: list[Simulator] = []

    def use(fake: Simulator) -> None:
        fakes.append(fake)
        set_cuda_runtime(CudaRuntime(fake))

    yield use
    set_cuda_runtime(previous)
    for fake in fakes:
        fake.close()


def test_the_mlock_variant_is_named_for_what_it_is() -> None:
    locked = LockedHostMemory(limit="64MiB")
    assert isinstance(locked.backend, MlockBackend) and not locked.dma_registered
    assert repr(locked).startswith("LockedHostMemory(backend=mlock (page-locked only, not DMA")
    assert "**not** DMA-registered" in (LockedHostMemory.__doc__ or "")
    assert "not DMA-registered" in repr(PinnedHostMemory("mlock"))
    assert not MlockBackend.dma_registered
    address = locked.allocate(4096)
    locked.deallocate(address, 4096)


def test_auto_pins_through_the_driver_where_cuda_is_present(cuda_runtime_is) -> None:  # type: ignore[no-untyped-def]
    fake = Simulator()
    cuda_runtime_is(fake)
    pinned = PinnedHostMemory()
    assert isinstance(pinned.backend, CudaHostAllocBackend) and pinned.dma_registered
    assert "(DMA-registered)" in repr(pinned)
    address = pinned.allocate(4096)
    assert address in fake.live()
    pinned.deallocate(address, 4096)
    assert PinnedHostMemory("cuda").dma_registered


def test_auto_falls_back_to_mlock_without_a_gpu(cuda_runtime_is) -> None:  # type: ignore[no-untyped-def]
    cuda_runtime_is(Simulator(devices=0))
    assert isinstance(PinnedHostMemory().backend, MlockBackend)
    with pytest.raises(UnknownNameError, match="needs a CUDA device"):
        PinnedHostMemory("cuda")


def test_cuda_backend_without_the_bindings_names_the_extra() -> None:
    previous = set_cuda_runtime(None)
    try:
        try:
            import cuda.bindings.runtime  # noqa: F401
        except ImportError:
            with pytest.raises(MissingDependencyError, match="cuda"):
                PinnedHostMemory("cuda")
            assert isinstance(PinnedHostMemory().backend, MlockBackend)
        else:  # pragma: no cover - a machine with the bindings
            pytest.skip("the CUDA bindings are installed here")
    finally:
        set_cuda_runtime(previous)
