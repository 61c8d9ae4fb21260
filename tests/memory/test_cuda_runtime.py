"""The CUDA runtime wrapper over a fake bindings module: every status is checked and becomes our
error; the outputs come back as ints; the CUDA 12/13 signature change is handled."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from _fake_cuda import FakeCudart, cudaError_t, cudaMemLocation
from tensorarena.errors import CudaError, InvalidArgumentError, MissingDependencyError
from tensorarena.memory.cuda import (
    CPU_DEVICE,
    CudaEvents,
    CudaRuntime,
    CudaStream,
    cuda_available,
    cuda_runtime,
    set_cuda_runtime,
    stream_handle,
)
from tensorarena.streams import completed


@pytest.fixture
def fake() -> Iterator[FakeCudart]:
    module = FakeCudart()
    yield module
    module.close()


def test_every_failing_status_is_a_cuda_error_naming_the_call(fake: FakeCudart) -> None:
    runtime = CudaRuntime(fake)
    calls = {
        "cudaMalloc": lambda: runtime.malloc(64),
        "cudaSetDevice": lambda: runtime.set_device(1),
        "cudaMemGetInfo": runtime.mem_get_info,
        "cudaHostAlloc": lambda: runtime.host_alloc(64),
        "cudaStreamCreateWithFlags": runtime.stream_create,
        "cudaEventCreateWithFlags": runtime.event_create,
        "cudaDeviceSynchronize": runtime.device_synchronize,
    }
    for name, call in calls.items():
        fake.fail[name] = cudaError_t.cudaErrorInvalidValue
        with pytest.raises(CudaError) as error:
            call()
        assert (error.value.call, error.value.status) == (name, 1)
        assert error.value.name == "cudaErrorInvalidValue"
        assert f"{name} failed: cudaErrorInvalidValue" in str(error.value)
        assert isinstance(error.value, RuntimeError)
        assert fake.names()[-1] == "cudaGetLastError", "the thread's last error is cleared"


def test_outputs_are_plain_ints(fake: FakeCudart) -> None:
    runtime = CudaRuntime(fake)
    assert runtime.device_count() == 2 and runtime.get_device() == 0
    address = runtime.malloc(1000)
    assert type(address) is int and address in fake.buffers
    free, total = runtime.mem_get_info()
    assert (free, total) == (fake.capacity - 1000, fake.capacity)
    runtime.free(address)
    with pytest.raises(CudaError, match="cudaErrorInvalidValue"):
        runtime.free(address)  # the fake checks frees like the driver does


def test_status_names_come_from_the_bindings_when_the_enum_has_none(fake: FakeCudart) -> None:
    class Plain:
        def cudaMalloc(self, size: int) -> tuple[int, int]:
            return 2, 0

        cudaGetErrorName = fake.cudaGetErrorName

    with pytest.raises(CudaError, match="cudaErrorMemoryAllocation"):
        CudaRuntime(Plain()).malloc(1)

    class Bare:
        def cudaMalloc(self, size: int) -> tuple[int, int]:
            return 7, 0

    with pytest.raises(CudaError, match="cudaError 7"):
        CudaRuntime(Bare()).malloc(1)


def test_on_device_switches_and_restores(fake: FakeCudart) -> None:
    runtime = CudaRuntime(fake)
    with runtime.on_device(1):
        assert runtime.get_device() == 1
    assert runtime.get_device() == 0
    before = len(fake.calls)
    with runtime.on_device(0):
        pass
    assert fake.names()[before:] == ["cudaGetDevice"]  # already current: no switching
    with pytest.raises(CudaError), runtime.on_device(5):
        pass
    assert runtime.get_device() == 0


def test_availability_without_a_driver_or_a_device() -> None:
    assert not CudaRuntime(FakeCudart(driver=False)).available()
    assert not CudaRuntime(FakeCudart(devices=0)).available()
    assert CudaRuntime(FakeCudart()).available()


@pytest.mark.parametrize("legacy", [False, True], ids=["cuda13-location", "cuda12.0-device"])
def test_hints_use_the_signature_the_bindings_have(legacy: bool) -> None:
    fake = FakeCudart(legacy=legacy)
    runtime = CudaRuntime(fake)
    address = runtime.malloc_managed(1 << 20)
    runtime.mem_advise(address, 4096, 3, 1)
    runtime.mem_advise(address, 4096, 5, CPU_DEVICE)
    runtime.mem_prefetch(address, 8192, 0, 0)
    runtime.mem_prefetch(address, 8192, CPU_DEVICE, 0)
    assert fake.advice == [(address, 4096, 3, 1), (address, 4096, 5, -1)]
    assert fake.prefetches == [(address, 8192, 0, 0), (address, 8192, -1, 0)]
    fake.close()


def test_bindings_with_the_location_type_but_old_signatures_fall_back_once() -> None:
    fake = FakeCudart(legacy=True)
    fake.cudaMemLocation = cudaMemLocation  # type: ignore[attr-defined]
    runtime = CudaRuntime(fake)
    address = runtime.malloc_managed(4096)
    runtime.mem_prefetch(address, 4096, 1, 0)
    runtime.mem_prefetch(address, 4096, 0, 0)
    assert fake.prefetches == [(address, 4096, 1, 0), (address, 4096, 0, 0)]
    with pytest.raises(InvalidArgumentError, match="cudaMemoryAdvise"):
        runtime.mem_advise(address, 4096, 99, 0)
    fake.close()


def test_events_and_streams_over_the_runtime(fake: FakeCudart) -> None:
    runtime = CudaRuntime(fake)
    gate = threading.Event()
    stream = CudaStream(runtime=runtime)
    other = CudaStream(runtime=runtime)
    fake.streams[stream.handle].submit(gate.wait, 2)
    event = stream.record()
    assert not event.query() and not stream.query()
    other.wait(event)  # device-side wait: the host does not block
    assert fake.names()[-1] == "cudaStreamWaitEvent"
    gate.set()
    event.synchronize()
    assert event.query()
    other.synchronize()
    other.wait(completed())  # not a CUDA event: waited for on the host
    assert stream == CudaStream(handle=stream.handle, runtime=runtime) == stream.handle
    assert hash(stream) == hash(stream.handle) and int(stream) == stream.handle
    assert "borrowed" in repr(CudaStream.legacy_default(runtime=runtime))
    handle = stream.handle
    del stream, event
    import gc

    gc.collect()
    assert handle not in fake.streams, "a stream made here is destroyed when collected"


def test_event_query_errors_other_than_not_ready_raise(fake: FakeCudart) -> None:
    runtime = CudaRuntime(fake)
    event = CudaEvents(runtime).record(None)
    fake.fail["cudaEventQuery"] = cudaError_t.cudaErrorNotReady
    assert not event.query() and fake.names()[-1] == "cudaEventQuery", "not an error to clear"
    fake.fail["cudaEventQuery"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError):
        event.query()
    fake.fail["cudaEventRecord"] = cudaError_t.cudaErrorInvalidValue
    before = len(fake.events)
    with pytest.raises(CudaError):
        CudaEvents(runtime).record(0)
    assert len(fake.events) == before, "an event that failed to record is destroyed"


def test_stream_handles_from_every_framework() -> None:
    class TorchLike:
        cuda_stream = 0x7000

    class CupyLike:
        ptr = 0x8000

    assert stream_handle(None) == 0 and stream_handle(0x10) == 0x10
    assert stream_handle(TorchLike()) == 0x7000 and stream_handle(CupyLike()) == 0x8000
    for bad in (True, -1, "stream", 1.5j):
        with pytest.raises(InvalidArgumentError):
            stream_handle(bad)


@pytest.mark.parametrize("bad", [1.5, 2.0, "7", b"7"], ids=repr)
def test_a_float_or_a_string_is_no_stream_handle(bad: object) -> None:
    # int() made handles of them: 2.7 was the per-thread default stream, "7" stream 7.
    with pytest.raises(InvalidArgumentError, match="int handle"):
        stream_handle(bad)


def test_the_process_runtime_is_lazy_and_replaceable(fake: FakeCudart) -> None:
    previous = set_cuda_runtime(CudaRuntime(fake))
    try:
        assert cuda_runtime().bindings is fake and cuda_available()
        with pytest.raises(InvalidArgumentError):
            set_cuda_runtime(fake)  # type: ignore[arg-type]
    finally:
        set_cuda_runtime(previous)


def test_missing_bindings_name_the_extra() -> None:
    previous = set_cuda_runtime(None)
    try:
        try:
            import cuda.bindings.runtime  # noqa: F401
        except ImportError:
            with pytest.raises(MissingDependencyError, match=r"tensorarena\[cuda\]"):
                cuda_runtime()
            assert not cuda_available()
        else:  # pragma: no cover - a machine with the bindings
            assert isinstance(cuda_runtime(), CudaRuntime)
    finally:
        set_cuda_runtime(previous)


@pytest.mark.parametrize("event", [3, None, "event"], ids=repr)
def test_waiting_for_what_is_not_an_event_is_refused(fake: FakeCudart, event: object) -> None:
    # CudaStream.wait(3) and CudaEvents.wait(stream, 3) raised AttributeError ('int' object
    # has no attribute 'synchronize'); CpuStream.wait already refused it.
    runtime = CudaRuntime(fake)
    with pytest.raises(InvalidArgumentError, match="needs an event"):
        CudaStream(runtime=runtime).wait(event)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="needs an event"):
        CudaEvents(runtime).wait(0, event)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="int handle"):
        CudaEvents(runtime).wait("stream", completed())
