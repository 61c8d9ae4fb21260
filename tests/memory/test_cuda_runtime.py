"""The CUDA runtime wrapper over the simulated bindings (tensorarena.testing.cuda): every status
is checked and becomes our error; the outputs come back as ints; the CUDA 12/13 signature change
is handled; device switches make no context on a device the thread did not use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorarena.errors import CudaError, InvalidArgumentError, MissingDependencyError
from tensorarena.memory.cuda import (
    CPU_DEVICE,
    CudaEvents,
    CudaRuntime,
    CudaStream,
    cuda_available,
    cuda_runtime,
    handle_value,
    idle_events,
    set_cuda_runtime,
    stream_handle,
)
from tensorarena.streams import completed
from tensorarena.testing.cuda import Simulator, cudaError_t, cudaMemLocation, simulated


@pytest.fixture
def fake() -> Iterator[Simulator]:
    module = Simulator()
    yield module
    module.close()


def test_every_failing_status_is_a_cuda_error_naming_the_call(fake: Simulator) -> None:
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


def test_outputs_are_plain_ints(fake: Simulator) -> None:
    runtime = CudaRuntime(fake)
    assert runtime.device_count() == 2 and runtime.get_device() == 0
    address = runtime.malloc(1000)
    assert type(address) is int and address in fake.live()
    free, total = runtime.mem_get_info()
    assert (free, total) == (fake.capacity - 1024, fake.capacity)  # whole 256-byte granules
    runtime.free(address)
    with pytest.raises(CudaError, match="cudaErrorInvalidValue"):
        runtime.free(address)  # the simulator checks frees like the driver does


def test_status_names_come_from_the_bindings_when_the_enum_has_none(fake: Simulator) -> None:
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


def test_on_device_switches_and_restores(fake: Simulator) -> None:
    runtime = CudaRuntime(fake)
    runtime.free(0)  # the thread uses device 0: its context exists
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
    assert not CudaRuntime(Simulator(driver=False)).available()
    assert not CudaRuntime(Simulator(devices=0)).available()
    assert CudaRuntime(Simulator()).available()


@pytest.mark.parametrize("api", ["13", "12.2", "12.0"])
def test_hints_use_the_signature_the_bindings_have(api: str) -> None:
    fake = Simulator(api=api)
    runtime = CudaRuntime(fake)
    address = runtime.malloc_managed(1 << 20)
    runtime.mem_advise(address, 4096, 3, 1)
    runtime.mem_advise(address, 4096, 5, CPU_DEVICE)
    runtime.mem_prefetch(address, 8192, 0, 0)
    runtime.mem_prefetch(address, 8192, CPU_DEVICE, 0)
    assert fake.advice == [(address, 4096, 3, 1), (address, 4096, 5, -1)]
    assert fake.prefetches == [(address, 8192, 0, 0), (address, 8192, -1, 0)]
    assert fake.names().count("cudaMemAdvise") == 2
    fake.close()


def test_bindings_with_the_location_type_but_old_signatures_fall_back_once() -> None:
    fake = Simulator(api="12.0")
    fake.cudaMemLocation = cudaMemLocation  # type: ignore[attr-defined]
    runtime = CudaRuntime(fake)
    address = runtime.malloc_managed(4096)
    runtime.mem_prefetch(address, 4096, 1, 0)
    runtime.mem_prefetch(address, 4096, 0, 0)
    assert fake.prefetches == [(address, 4096, 1, 0), (address, 4096, 0, 0)]
    with pytest.raises(InvalidArgumentError, match="cudaMemoryAdvise"):
        runtime.mem_advise(address, 4096, 99, 0)
    fake.close()


def test_events_and_streams_over_the_runtime(fake: Simulator) -> None:
    runtime = CudaRuntime(fake)
    stream = CudaStream(runtime=runtime)
    other = CudaStream(runtime=runtime)
    fake.hold(stream.handle)  # a long kernel: the stream's work stays queued
    fake.launch(stream.handle, lambda: None)
    event = stream.record()
    assert not event.query() and not stream.query()
    assert fake.names()[-1] == "cudaStreamQuery", "no event made to ask a stream"
    other.wait(event)  # device-side wait: the host does not block
    assert fake.names()[-1] == "cudaStreamWaitEvent"
    fake.hold(stream.handle, False)
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
    assert ("cudaStreamDestroy", (handle,)) in fake.calls, "a stream made here is destroyed"
    assert idle_events(runtime, 0) == 1, "the event went back to the device's pool"
    again = CudaStream(runtime=runtime, device=0).record()
    assert again.device == 0
    assert idle_events(runtime, 0) == 0 and fake.names().count("cudaEventCreateWithFlags") == 1


def test_event_query_errors_other_than_not_ready_raise(fake: Simulator) -> None:
    runtime = CudaRuntime(fake)
    event = CudaEvents(runtime).record(None)
    fake.fail["cudaEventQuery"] = cudaError_t.cudaErrorNotReady
    assert not event.query() and fake.names()[-1] == "cudaEventQuery", "not an error to clear"
    fake.fail["cudaEventQuery"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError):
        event.query()
    fake.fail["cudaEventRecord"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError):
        CudaEvents(runtime).record(0)
    assert fake.names()[-1] == "cudaEventDestroy", "an event that failed to record is destroyed"


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


def test_the_process_runtime_is_lazy_and_replaceable(fake: Simulator) -> None:
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
def test_waiting_for_what_is_not_an_event_is_refused(fake: Simulator, event: object) -> None:
    # CudaStream.wait(3) and CudaEvents.wait(stream, 3) raised AttributeError ('int' object
    # has no attribute 'synchronize'); CpuStream.wait already refused it.
    runtime = CudaRuntime(fake)
    with pytest.raises(InvalidArgumentError, match="needs an event"):
        CudaStream(runtime=runtime).wait(event)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="needs an event"):
        CudaEvents(runtime).wait(0, event)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="int handle"):
        CudaEvents(runtime).wait("stream", completed())


def test_switching_to_a_device_never_makes_a_context_on_the_one_left() -> None:
    # on_device(1) restored device 0 with cudaSetDevice, which (CUDA 12) made device 0's context
    # in a thread that only ever worked on device 1.
    with simulated(devices=2, memory="1MiB") as sim:
        runtime = cuda_runtime()
        with runtime.on_device(1):
            runtime.free(runtime.malloc(256))
        assert sim.contexts == [0, 1]
        assert runtime.get_device() == 1, "left on device 1, as PyTorch's MaybeSetDevice does"


def test_handles_are_read_with_the_cuda13_accessor() -> None:
    class Handle:
        def getPtr(self) -> int:
            return 0x5000

        def __int__(self) -> int:
            raise AssertionError("int() of a handle is deprecated in cuda-bindings 13")

    assert handle_value(Handle()) == 0x5000 and handle_value(7) == 7


def test_block_device_switches_around_a_free_only_where_there_is_cuda() -> None:
    from tensorarena.memory.cuda.current import block_device

    with simulated(devices=2, memory="1MiB") as sim:
        runtime = cuda_runtime()
        runtime.free(0)  # the thread uses device 0
        with block_device(1):
            assert runtime.get_device() == 1
        with block_device(None):
            assert runtime.get_device() == 0, "an unknown device switches nothing"
        assert runtime.get_device() == 0 and sim.contexts == [1, 1]
    previous = set_cuda_runtime(CudaRuntime(Simulator(devices=0)))
    try:
        with block_device(3):  # no device: nothing to switch, nothing raised
            pass
    finally:
        set_cuda_runtime(previous)


def test_has_context_reads_the_driver_and_assumes_one_where_it_cannot_say() -> None:
    class Driver:
        def __init__(self, answer: tuple[int, ...]) -> None:
            self.answer = answer

        def cuDevicePrimaryCtxGetState(self, device: int) -> tuple[int, ...]:
            return self.answer

    sim = Simulator(devices=2)
    assert not CudaRuntime(sim, Driver((0, 0, 0))).has_context(0)
    assert CudaRuntime(sim, Driver((0, 0, 1))).has_context(0)
    assert not CudaRuntime(sim, Driver((3,))).has_context(0), "not initialised: no context"
    assert CudaRuntime(sim, Driver((999,))).has_context(0), "another error: assume one"
    assert CudaRuntime(sim, object()).has_context(0), "no driver call: assume one"
