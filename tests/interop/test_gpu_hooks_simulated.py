"""The GPU hooks on the simulated CUDA runtime (two devices, several streams): each test here
failed before the fix it names, found by reading the hooks against CUDA's contracts."""

from __future__ import annotations

import ctypes
import gc
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _shim_calls import c_calls

from tensorarena.errors import UnsupportedError
from tensorarena.interop import DeviceArray, device_empty
from tensorarena.interop.cupy_allocator import CupyAllocator
from tensorarena.interop.numba_emm import memory_manager_class
from tensorarena.interop.stream_pools import stream_ordered_pool
from tensorarena.interop.torch_allocator import TorchAllocator
from tensorarena.memory.cuda import CudaStream, cuda_runtime, register
from tensorarena.streams import CpuStream
from tensorarena.testing.cuda import Simulator, simulated


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(devices=2, memory="4MiB", seed=7) as simulator:
        yield simulator


def write(value: int):
    def kernel(view: memoryview) -> None:
        view[:] = bytes([value]) * len(view)

    return kernel


# --- stream-ordered reuse by default --------------------------------------------------------


def fake_cupy(stream: list[int]) -> Any:
    class UnownedMemory:
        def __init__(self, ptr: int, size: int, owner: object, device_id: int) -> None:
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem: UnownedMemory, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    cuda = types.SimpleNamespace(
        UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
        get_current_stream=lambda: types.SimpleNamespace(ptr=stream[0]),
        Device=lambda: types.SimpleNamespace(id=cuda_runtime().get_device()),
    )
    return types.SimpleNamespace(cuda=cuda)


def test_cupy_blocks_are_not_handed_to_another_stream_while_a_kernel_uses_them(
    sim: Simulator,
) -> None:
    # The default was the plain device pool: the block went to stream B at once.
    a, b = CudaStream(), CudaStream()
    current = [a.handle]
    allocator = CupyAllocator(cupy=fake_cupy(current))
    sim.hold(a.handle)  # A's kernel is still running when CuPy drops the array
    pointer = allocator(4096)
    sim.launch(a, write(1), writes=[(pointer.ptr, 4096)])
    del pointer
    gc.collect()
    current[0] = b.handle
    again = allocator(4096)
    sim.launch(b, write(2), writes=[(again.ptr, 4096)])
    assert sim.races == []
    sim.hold(a.handle, False)


def test_device_arrays_are_reused_in_stream_order(sim: Simulator) -> None:
    a, b = CudaStream(), CudaStream()
    sim.hold(a.handle)
    first = device_empty(1024, np.uint8, stream=a)
    sim.launch(a, write(1), writes=[(first.address, 1024)])
    del first
    second = device_empty(1024, np.uint8, stream=b)
    sim.launch(b, write(2), writes=[(second.address, 1024)])
    assert sim.races == []
    assert second.resource is stream_ordered_pool(0)


def test_numba_blocks_freed_after_a_blocking_streams_kernel_wait_for_it(sim: Simulator) -> None:
    numba_cuda = types.SimpleNamespace(
        HostOnlyCUDAMemoryManager=type("Host", (), {"__init__": lambda self, context: setattr(
            self, "context", context)}),
        MemoryPointer=lambda context, pointer, size, finalizer: types.SimpleNamespace(
            pointer=pointer, size=size, finalizer=finalizer),
        MemoryInfo=lambda free, total: (free, total),
        cudadrv=types.SimpleNamespace(driver=types.SimpleNamespace(USE_NV_BINDING=False)),
    )
    manager = memory_manager_class(numba_cuda=numba_cuda)(
        types.SimpleNamespace(device=types.SimpleNamespace(id=1)))
    runtime = cuda_runtime()
    with runtime.on_device(1):
        s1 = sim.cudaStreamCreateWithFlags(0)[1]  # Numba's streams are blocking ones
        s2 = sim.cudaStreamCreateWithFlags(0)[1]
        sim.hold(s1)
        block = manager.memalloc(4096)
        sim.launch(s1, write(1), writes=[(block.pointer.value, 4096)])
    block.finalizer()  # from device 0, as the garbage collector might
    with runtime.on_device(1):
        again = manager.memalloc(4096)
        sim.launch(s2, write(2), writes=[(again.pointer.value, 4096)])
    assert sim.races == []
    sim.hold(s1, False)


# --- frees on a device that is not current, and no context on an unused device ---------------




def test_torch_frees_a_block_of_another_device_than_the_current_one(
    sim: Simulator, shim: Path
) -> None:
    # The event was made on the current device (0) and recorded on device 1's stream: CUDA
    # refused, the error was swallowed, and the block stayed live for good.
    allocator = TorchAllocator(shim=shim).activate()
    lib = c_calls(shim)
    runtime = cuda_runtime()
    runtime.free(0)  # this thread works on device 0
    with runtime.on_device(1):
        stream = CudaStream()  # a stream of device 1
        address = lib.ta_malloc(4096, 1, ctypes.c_void_p(stream.handle))
    assert runtime.get_device() == 0
    lib.ta_free(address, 4096, 1, ctypes.c_void_p(stream.handle))  # device 0 current
    assert (allocator.frees, allocator.failures) == (1, 0), allocator.last_error
    assert runtime.get_device() == 0, "the current device is put back"
    assert stream_ordered_pool(1).live_blocks() == {}


def test_work_on_device_1_never_makes_device_0s_context(sim: Simulator, shim: Path) -> None:
    allocator = TorchAllocator(shim=shim).activate()
    lib = c_calls(shim)
    for _ in range(3):
        address = lib.ta_malloc(4096, 1, None)
        lib.ta_free(address, 4096, 1, None)
    array = device_empty(256, np.uint8, resource=stream_ordered_pool(1))
    del array
    assert allocator.failures == 0 and sim.contexts == [0, 1]


def test_install_is_refused_in_favour_of_mem_pool(shim: Path) -> None:
    # install() routed every allocation through change_current_allocator, which does not
    # check for NULL: an exhausted pool gave PyTorch a tensor at address 0.
    with pytest.raises(UnsupportedError, match="mem_pool"):
        TorchAllocator(shim=shim).install()


def test_alloc_and_free_from_two_threads_cannot_deadlock(sim: Simulator, shim: Path) -> None:
    # PyTorch calls the shim with its own lock held and the callback takes the GIL; the
    # callbacks take no lock of ours that could be held while waiting for the GIL.
    allocator = TorchAllocator(shim=shim).activate()
    lib = c_calls(shim)
    handed: list[int] = []
    ready = threading.Condition()
    done = threading.Event()

    def allocate() -> None:
        for _ in range(200):
            address = lib.ta_malloc(512, 0, None)
            with ready:
                handed.append(address)
                ready.notify()
        done.set()

    def free() -> None:
        freed = 0
        while freed < 200:
            with ready:
                ready.wait_for(lambda: handed, timeout=5)
                batch, handed[:] = list(handed), []
            for address in batch:
                lib.ta_free(address, 512, 0, None)
                freed += 1

    threads = [threading.Thread(target=allocate), threading.Thread(target=free)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "deadlocked"
    assert (allocator.allocations, allocator.frees, allocator.failures) == (200, 200, 0)


# --- __cuda_array_interface__ streams, version 3 -----------------------------------------------


def test_the_interface_stream_follows_version_3(sim: Simulator) -> None:
    # An upload still running on the legacy stream was published as None (no sync needed).
    array = device_empty(64, np.uint8, resource=stream_ordered_pool(0))
    assert array.__cuda_array_interface__["stream"] is None, "nothing written yet"
    array.written_on(None)
    assert array.__cuda_array_interface__["stream"] == 1, "the legacy default stream"
    array.written_on(0)
    assert array.__cuda_array_interface__["stream"] == 1
    array.written_on(2)
    assert array.__cuda_array_interface__["stream"] == 2, "the per-thread default stream"
    stream = CudaStream()
    array.written_on(stream)
    assert array.__cuda_array_interface__["stream"] == stream.handle
    array.written_on(CpuStream("cpu"))
    assert array.__cuda_array_interface__["stream"] is None
    assert isinstance(array, DeviceArray)
    del array  # a CPU stream the CUDA pool cannot order on: freed on its default, not lost
    gc.collect()
    assert stream_ordered_pool(0).live_blocks() == {}


# --- host registrations ------------------------------------------------------------------------


def test_a_dropped_registration_unregisters_and_read_only_is_offered(sim: Simulator) -> None:
    array = np.zeros(4096, np.uint8)
    registration = register(array, read_only=True)
    assert sim.live()[array.ctypes.data].flags & 8, "cudaHostRegisterReadOnly"
    del registration
    gc.collect()
    assert sim.registered == {}, "unregistered before the array could go away"
    with register(array) as again:
        assert sim.registered == {array.ctypes.data: 4096} and again.open
    assert sim.registered == {}


def test_one_stream_ordered_pool_per_device_pool(sim: Simulator) -> None:
    from tensorarena.memory import device_pool

    first, second = stream_ordered_pool(0), stream_ordered_pool(1)
    assert first is stream_ordered_pool(0) and first is not second
    assert second.upstream is device_pool(1) and second.default_stream == 0
    with simulated(devices=2, memory="4MiB"):
        assert stream_ordered_pool(1) is not second, "a new registry gets new pools"
