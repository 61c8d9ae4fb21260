"""CudaMemory, ManagedMemory and the driver-pinning backends over the simulated CUDA runtime: the
bookkeeping, the device each call runs on, and the state left when the driver says no."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.errors import (
    CudaError,
    InvalidAddressError,
    InvalidArgumentError,
    OutOfMemoryError,
)
from tensorarena.memory import PinnedHostMemory, Pool
from tensorarena.memory.cuda import (
    CudaHostAllocBackend,
    CudaMemory,
    CudaRegisterBackend,
    CudaRuntime,
    ManagedMemory,
    register,
)
from tensorarena.testing.cuda import Simulator, cudaError_t

MiB = 1 << 20


@pytest.fixture
def fake() -> Iterator[Simulator]:
    module = Simulator(memory=16 * MiB)
    yield module
    module.close()


@pytest.fixture
def runtime(fake: Simulator) -> CudaRuntime:
    return CudaRuntime(fake)


def test_cuda_memory_allocates_on_its_own_device_and_restores_the_current_one(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    runtime.free(0)  # this thread works on device 0 (its context exists), so it is restored
    memory = CudaMemory(1, runtime=runtime)
    assert memory.device == 1 and memory.memory_kind is ta.MemoryKind.DEVICE
    address = memory.allocate(1000)
    assert fake.live()[address].device == 1, "allocated on device 1"
    assert runtime.get_device() == 0, "the current device is restored"
    assert fake.used == [0, 1024], "whole 256-byte granules, as cudaMalloc"
    assert memory.statistics().allocated_bytes.current == 1000
    assert memory.mem_info() == (16 * MiB - 1024, 16 * MiB)
    memory.deallocate(address, 1000)
    assert fake.used == [0, 0] and memory.live_blocks() == {}
    assert "device=1" in repr(memory)
    assert CudaMemory(runtime=runtime).device == 0  # the current device by default


def test_large_alignments_are_honoured_inside_a_larger_block(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    memory = CudaMemory(runtime=runtime)
    address = memory.allocate(100, alignment=1 << 16)
    assert address % (1 << 16) == 0
    assert memory.statistics().allocated_bytes.current == 100 + (1 << 16) - 256
    memory.deallocate(address, 100)
    assert not fake.live()


def test_out_of_device_memory_is_out_of_memory_with_the_devices_numbers(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    memory = CudaMemory(runtime=runtime)
    keep = memory.allocate(10 * MiB)
    before = memory.statistics()
    with pytest.raises(OutOfMemoryError) as error:
        memory.allocate(8 * MiB)
    assert error.value.free == 6 * MiB and error.value.capacity == 16 * MiB
    assert "cudaErrorMemoryAllocation" in str(error.value) and "device 0" in str(error.value)
    assert memory.statistics() == dataclasses.replace(before, num_ooms=1)
    memory.deallocate(keep, 10 * MiB)


def test_driver_failures_leave_the_ledger_unchanged(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    memory = CudaMemory(runtime=runtime)
    fake.fail["cudaMalloc"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError):
        memory.allocate(64)
    assert memory.statistics().allocations.total == 0
    address = memory.allocate(64)
    fake.fail["cudaFree"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError, match="cudaFree"):
        memory.deallocate(address, 64)
    assert memory.live_blocks() == {address: 64}, "still live: the driver kept it"
    memory.deallocate(address, 64)


def test_devices_are_checked(runtime: CudaRuntime) -> None:
    for bad in (2, -1, "0", True, 1.0):
        with pytest.raises(InvalidArgumentError, match="device"):
            CudaMemory(bad, runtime=runtime)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="none is visible"):
        CudaMemory(0, runtime=CudaRuntime(Simulator(devices=0)))


def test_a_pool_over_device_memory_carves_arenas(fake: Simulator, runtime: CudaRuntime) -> None:
    pool = Pool(CudaMemory(runtime=runtime), initial_size="1MiB")
    blocks = [pool.allocate(1000) for _ in range(100)]
    assert fake.names().count("cudaMalloc") == 1, "one cudaMalloc for a hundred blocks"
    for block in blocks:
        pool.deallocate(block, 1000)
    pool.trim()
    assert not fake.live()


def test_managed_memory_refuses_more_than_the_device_has_free_before_asking(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    managed = ManagedMemory(runtime=runtime)
    assert managed.memory_kind is ta.MemoryKind.MANAGED
    with pytest.raises(OutOfMemoryError, match="never asked"):
        managed.allocate(17 * MiB)
    assert "cudaMallocManaged" not in fake.names()
    assert managed.statistics().num_ooms == 1
    fake.fail["cudaMallocManaged"] = cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(OutOfMemoryError, match="cudaMallocManaged"):
        managed.allocate(MiB)
    assert managed.live_blocks() == {}


def test_managed_memory_is_host_accessible(runtime: CudaRuntime) -> None:
    managed = ManagedMemory(runtime=runtime)
    array = ta.empty((256, 256), np.float32, resource=managed)
    array[:] = 3
    assert float(array.sum()) == 3 * 256 * 256
    del array
    assert managed.live_blocks() == {}


def test_advice_and_prefetch_check_the_range_first(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    managed = ManagedMemory(1, runtime=runtime)
    address = managed.allocate(MiB)
    managed.advise(address, MiB, "read_mostly")
    managed.advise(address + 4096, 4096, "preferred_location", "cpu")
    managed.advise(address, 4096, "accessed_by", 0)
    managed.prefetch(address, MiB)
    stream = runtime.stream_create()
    managed.prefetch(address, 4096, "cpu", stream=stream)
    assert fake.advice == [
        (address, MiB, 1, 1), (address + 4096, 4096, 3, -1), (address, 4096, 5, 0)
    ]
    assert fake.prefetches == [(address, MiB, 1, 0), (address, 4096, -1, stream)]
    calls = len(fake.calls)
    for start, size in ((address + MiB - 10, 20), (address - 1, 10), (1 << 40, 1)):
        with pytest.raises(InvalidAddressError, match="not inside a live block"):
            managed.prefetch(start, size)
    with pytest.raises(InvalidArgumentError, match="unknown advice"):
        managed.advise(address, 10, "sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="device"):
        managed.prefetch(address, 10, 7)
    assert len(fake.calls) == calls, "nothing reached the driver"
    managed.deallocate(address, MiB)


def test_pinned_host_memory_through_cuda_host_alloc(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    pinned = PinnedHostMemory(CudaHostAllocBackend(runtime=runtime))
    assert pinned.limit is None and pinned.dma_registered
    address = pinned.allocate(5000, alignment=1 << 16)
    assert address % (1 << 16) == 0 and fake.names().count("cudaHostAlloc") == 1
    array = ta.empty(5000, np.uint8, resource=pinned)
    array[:] = 7
    del array
    pinned.deallocate(address, 5000)
    assert not fake.live()
    fake.fail["cudaHostAlloc"] = cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(OutOfMemoryError, match="could not pin"):
        pinned.allocate(4096)
    fake.fail["cudaHostAlloc"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError):
        pinned.allocate(4096)
    assert pinned.live_blocks() == {}
    assert "cuda_host_alloc" in repr(pinned) and "DMA-registered" in repr(pinned)


def test_pinned_host_memory_through_cuda_host_register(
    fake: Simulator, runtime: CudaRuntime
) -> None:
    pinned = PinnedHostMemory(CudaRegisterBackend(runtime=runtime))
    address = pinned.allocate(10_000)
    assert fake.registered == {address: 12288}
    pinned.deallocate(address, 10_000)
    assert fake.registered == {}
    fake.fail["cudaHostRegister"] = cudaError_t.cudaErrorMemoryAllocation
    with pytest.raises(OutOfMemoryError):
        pinned.allocate(4096)
    fake.fail["cudaHostRegister"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError):
        pinned.allocate(4096)


def test_register_existing_host_memory_while_open(fake: Simulator, runtime: CudaRuntime) -> None:
    array = np.zeros(1000, np.float64)
    with register(array, runtime=runtime) as registration:
        assert fake.registered == {array.ctypes.data: 8000}
        assert registration.open and registration.nbytes == 8000
    assert fake.registered == {} and not registration.open
    registration.close()  # harmless
    registration = register(array.ctypes.data, 800, runtime=runtime)
    with pytest.raises(CudaError, match="AlreadyRegistered"):
        register(array.ctypes.data, 800, runtime=runtime)
    registration.close()
    for bad_call in (
        lambda: register(array[::2], runtime=runtime),
        lambda: register(array, 10, runtime=runtime),
        lambda: register(array.ctypes.data, runtime=runtime),
        lambda: register(np.zeros(0), runtime=runtime),
    ):
        with pytest.raises(InvalidArgumentError):
            bad_call()
    assert fake.registered == {}
