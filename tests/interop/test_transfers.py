"""Device arrays and staged transfers, on the CPU: "device" memory that is host memory underneath
(so every byte can be checked), copies queued on CPU streams or on the simulated CUDA runtime."""

from __future__ import annotations

import ctypes
import gc
import sys
import time
import weakref
from typing import Any

import numpy as np
import pytest

from tensorarena.errors import (
    DeviceUnavailableError,
    InvalidArgumentError,
    InvalidDtypeError,
    InvalidResourceError,
    InvalidSizeError,
)
from tensorarena.interop import DeviceArray, Transfers, device_empty
from tensorarena.interop.transfers import CudaCopies, StreamCopies
from tensorarena.memory import HostMemory, MemoryKind, PinnedHostMemory, Pool
from tensorarena.memory.cuda import (
    CudaHostAllocBackend,
    CudaMemory,
    CudaRuntime,
    CudaStream,
    cuda_runtime,
)
from tensorarena.streams import CpuStream
from tensorarena.testing.cuda import Simulator, simulated


class AsDevice:
    """A host pool that calls itself device memory: what a GPU's pool is to this code."""

    memory_kind = MemoryKind.DEVICE

    def __init__(self) -> None:
        self.pool = Pool(HostMemory())
        self.streams: list[object] = []

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return self.pool.allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.streams.append(stream)
        self.pool.deallocate(address, nbytes, stream)


class SlowCopies(StreamCopies):
    """Copies that take a while on their stream, so the host must wait for staging buffers."""

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        self._stream(stream).submit(time.sleep, 0.002)
        super().copy_async(dst, src, nbytes, stream)


def _bytes(array: DeviceArray) -> bytes:
    return ctypes.string_at(array.address, array.nbytes)


def test_a_device_array_describes_its_bytes_and_frees_them_when_it_dies() -> None:
    device = AsDevice()
    array = device_empty((3, 4), np.float64, resource=device, stream=None)
    interface = array.__cuda_array_interface__
    assert interface == {
        "shape": (3, 4), "typestr": "<f8", "data": (array.address, False), "strides": None,
        "version": 3, "stream": None,
    }
    array.written_on(0)  # the legacy default stream is 1 in the interface
    assert array.__cuda_array_interface__["stream"] == 1
    array.written_on(CpuStream())  # nothing a CUDA consumer could wait on
    assert array.__cuda_array_interface__["stream"] is None
    assert "shape=(3, 4)" in repr(array)
    del array
    gc.collect()
    assert device.pool.statistics().allocations.current == 0


def test_device_arrays_refuse_host_memory_and_bad_shapes() -> None:
    with pytest.raises(InvalidResourceError, match="device or managed"):
        device_empty(4, resource=Pool(HostMemory()))
    with pytest.raises(InvalidResourceError, match="declares no memory_kind"):
        device_empty(4, resource=object())  # type: ignore[arg-type]
    for shape in ((-1,), (2.0,), (True,)):
        with pytest.raises(Exception, match="shape"):
            device_empty(shape, resource=AsDevice())  # type: ignore[arg-type]
    with pytest.raises(InvalidDtypeError):
        device_empty(4, object, resource=AsDevice())
    assert device_empty(0, resource=AsDevice()).nbytes == 1  # an address, like every block


@pytest.mark.parametrize("nbytes", [1, 4096, 3 * 65536 + 123])
def test_round_trip_through_staging_buffers_on_a_cpu_stream(nbytes: int) -> None:
    device, staging = AsDevice(), Pool(HostMemory())
    with CpuStream() as stream:
        transfers = Transfers(device, staging, SlowCopies(stream), chunk="64KiB")
        data = np.random.default_rng(3).integers(0, 256, nbytes, dtype=np.uint8)
        on_device = transfers.to_device(data)
        stream.synchronize()
        assert _bytes(on_device) == data.tobytes()
        back = transfers.to_host(on_device)
        assert np.array_equal(back, data)
        out = np.empty_like(data)
        assert transfers.to_host(on_device, out=out) is out and np.array_equal(out, data)
        transfers.synchronize()
    stats = transfers.statistics()
    assert stats.bytes_to_device == nbytes and stats.bytes_to_host == 2 * nbytes
    assert stats.staging_in_flight == 0
    assert staging.statistics().allocations.current == 0, "every staging buffer went back"


def test_the_host_waits_for_a_staging_buffer_before_writing_it_again() -> None:
    device, staging = AsDevice(), Pool(HostMemory())
    with CpuStream() as stream:
        transfers = Transfers(device, staging, SlowCopies(stream), chunk="4KiB", depth=2)
        data = np.arange(64 * 1024, dtype=np.uint8)  # 16 chunks through 2 buffers
        on_device = transfers.to_device(data)
        assert transfers.statistics().host_waits > 0
        assert transfers.statistics().staging_in_flight >= 1, "the last copies still run"
        stream.synchronize()
        assert _bytes(on_device) == data.tobytes(), "no chunk was overwritten before its copy"
        transfers.to_device(data)  # completed buffers are reaped first
        transfers.synchronize()
    assert staging.statistics().allocations.current == 0


def test_to_device_returns_while_the_copies_still_run() -> None:
    device, staging = AsDevice(), Pool(HostMemory())
    with CpuStream() as stream:
        gate = __import__("threading").Event()
        stream.submit(gate.wait, 2)  # the stream is busy with earlier work
        transfers = Transfers(device, staging, StreamCopies(stream), chunk="1MiB", depth=4)
        on_device = transfers.to_device(np.ones(1 << 20, np.uint8), stream=stream)
        assert not stream.query(), "the copy is queued, not done: the host went on"
        gate.set()
        stream.synchronize()
        assert _bytes(on_device) == b"\x01" * (1 << 20)
        del on_device
        gc.collect()
        assert device.streams == [stream], "the block is freed on the stream that wrote it"
        transfers.synchronize()


def test_transfer_arguments_are_checked() -> None:
    device, staging = AsDevice(), Pool(HostMemory())
    with CpuStream() as stream:
        transfers = Transfers(device, staging, StreamCopies(stream))
        on_device = transfers.to_device(np.zeros((2, 3), np.float32))
        for out in (np.zeros((3, 2), np.float32), np.zeros((2, 3), np.float64),
                    np.zeros((2, 6), np.float32)[:, ::2], [0] * 6):
            with pytest.raises(InvalidArgumentError, match="out must be"):
                transfers.to_host(on_device, out=out)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            transfers.to_host(np.zeros(3))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            transfers.to_device(np.array([object()]))
        for depth in (0, 1.5, True):
            with pytest.raises(InvalidArgumentError):
                Transfers(device, staging, StreamCopies(stream), depth=depth)  # type: ignore[arg-type]
        with pytest.raises(InvalidResourceError):
            Transfers(staging, staging, StreamCopies(stream))
        assert "chunk=8 MiB" in repr(transfers)
        stream.synchronize()


def test_an_engine_or_stream_that_cannot_copy_is_refused_and_nothing_stays_allocated() -> None:
    # Transfers(..., engine=3) was accepted, and to_device(..., stream="s") on StreamCopies
    # raised AttributeError from inside the pipeline.
    device, staging = AsDevice(), Pool(HostMemory())
    with pytest.raises(InvalidArgumentError, match="CopyEngine"):
        Transfers(device, staging, 3)  # type: ignore[arg-type]
    with CpuStream() as stream:
        transfers = Transfers(device, staging, StreamCopies(stream), chunk=64)
        with pytest.raises(InvalidArgumentError, match="submit"):
            transfers.to_device(np.arange(100.0), stream="s")
        on_device = transfers.to_device(np.arange(100.0))
        with pytest.raises(InvalidArgumentError, match="submit"):
            transfers.to_host(on_device, stream=3)
        assert (transfers.to_host(on_device) == np.arange(100.0)).all()
        del on_device
        gc.collect()
    transfers.synchronize()
    assert device.pool.statistics().allocations.current == 0
    assert staging.statistics().allocations.current == 0


def test_round_trip_through_the_cuda_path_on_the_simulated_runtime() -> None:
    fake = Simulator(memory="64MiB", seed=1)
    runtime = CudaRuntime(fake)
    device = Pool(CudaMemory(runtime=runtime))
    staging = Pool(PinnedHostMemory(CudaHostAllocBackend(runtime=runtime)))
    transfers = Transfers(device, staging, CudaCopies(runtime), chunk="64KiB")
    stream = CudaStream(runtime=runtime)
    data = np.linspace(0, 1, 100_000)
    on_device = transfers.to_device(data, stream=stream)
    assert on_device.__cuda_array_interface__["stream"] == stream.handle
    assert fake.names().count("cudaMemcpyAsync") == -(-data.nbytes // 65536)
    back = transfers.to_host(on_device)  # on the stream that wrote it
    assert np.array_equal(back, data)
    transfers.synchronize()
    assert fake.races == []
    fake.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipelined_copies_on_two_devices_and_several_streams_keep_every_byte(seed: int) -> None:
    # The simulator runs each copy later, in a seeded interleaving: a staging chunk refilled by
    # the host before its copy ran, or a block read on one stream while another writes it,
    # shows as wrong bytes or a race.
    with simulated(devices=2, memory="16MiB", seed=seed) as sim:
        runtime = cuda_runtime()
        staging = Pool(PinnedHostMemory(CudaHostAllocBackend(runtime=runtime)))
        results = []
        for device in (0, 1):
            with runtime.on_device(device):
                pool = Pool(CudaMemory(device, runtime=runtime))
                transfers = Transfers(pool, staging, CudaCopies(runtime), chunk="16KiB")
                streams = [CudaStream(runtime=runtime) for _ in range(3)]
                for index, stream in enumerate(streams):
                    data = np.arange(20_000, dtype=np.int32) * (index + 1 + 10 * device)
                    on_device = transfers.to_device(data, stream=stream)
                    results.append((data, transfers.to_host(on_device), on_device))
                transfers.synchronize()
        for data, back, _ in results:
            assert np.array_equal(back, data)
        assert sim.races == [] and sim.sticky == [None, None]


def test_to_torch_without_cuda_raises_our_error_and_keeps_nothing_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.as_tensor raising for a missing CUDA kept a reference to the array (torch 2.13),
    so its block never went back; to_torch() now asks torch about CUDA first."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device = AsDevice()
    array = device_empty(16, np.float32, resource=device)
    alive = weakref.ref(array)
    with pytest.raises(DeviceUnavailableError, match="cannot use CUDA"):
        array.to_torch()
    del array
    gc.collect()
    assert alive() is None
    assert device.pool.statistics().allocations.current == 0


def test_to_torch_refuses_a_device_torch_does_not_see(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    device = AsDevice()
    address = device.allocate(64)
    array = DeviceArray(device, address, (16,), np.dtype(np.float32), device=3)
    with pytest.raises(DeviceUnavailableError, match="device 3 but torch sees 1"):
        array.to_torch()
    del array
    gc.collect()
    assert device.pool.statistics().allocations.current == 0


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ((0x1000, (4,), "not a dtype"), InvalidDtypeError),
        ((0x1000, (-4,), np.dtype(np.float32)), InvalidSizeError),
        ((-1, (4,), np.dtype(np.float32)), InvalidArgumentError),
        ((None, (4,), np.dtype(np.float32)), InvalidArgumentError),
    ],
)
def test_a_device_array_that_fails_to_build_frees_nothing_and_says_nothing(
    arguments: tuple[Any, ...], error: type[Exception]
) -> None:
    """Its __del__ used to run on the half-built object: an AttributeError printed as
    'Exception ignored in __del__', or, had the fields been set, a free of the caller's block."""
    device = AsDevice()
    address = device.allocate(64)
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with pytest.raises(error):
            DeviceArray(device, *arguments)
        with pytest.raises(InvalidResourceError):  # host memory: a GPU would fault on it
            DeviceArray(Pool(HostMemory()), address, (4,), np.dtype(np.float32))
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert unraisable == []
    assert device.streams == []  # nothing was freed on the caller's behalf
    device.deallocate(address, 64)  # the block is still the caller's
