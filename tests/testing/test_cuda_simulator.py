"""The simulated CUDA runtime's own rules, each at its boundary: contexts, devices of streams and
events, the legacy default stream, deferred work, races, memory calls and sticky errors."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from tensorarena.errors import CudaError, InvalidAddressError, InvalidArgumentError
from tensorarena.memory.cuda import CudaRuntime, CudaStream, cuda_runtime
from tensorarena.testing.cuda import Simulator, cudaError_t, simulated

OK = cudaError_t.cudaSuccess


@pytest.fixture
def sim() -> Iterator[Simulator]:
    simulator = Simulator(devices=2, memory="1MiB", seed=0)
    yield simulator
    simulator.close()


def fill(value: int):
    def kernel(*views: memoryview) -> None:
        views[-1][:] = bytes([value]) * len(views[-1])

    kernel.__name__ = f"fill{value}"
    return kernel


def test_simulated_installs_itself_and_puts_the_runtime_back() -> None:
    before = cuda_runtime.__module__  # the real runtime is never imported here
    with simulated(devices=2, memory="1MiB") as sim:
        assert cuda_runtime().bindings is sim
    with simulated(devices=1) as other:
        assert cuda_runtime().bindings is other and other.devices == 1
    assert before == "tensorarena.memory.cuda.runtime"


def test_contexts_are_made_on_first_use_and_counted_per_device(sim: Simulator) -> None:
    runtime = sim.runtime
    assert runtime.get_device() == 0 and sim.contexts == [0, 0], "asking makes no context"
    runtime.set_device(1)
    address = runtime.malloc(100)
    runtime.free(address)
    assert sim.contexts == [0, 1]
    state = sim.cuDevicePrimaryCtxGetState(0)
    assert state == (OK, 0, False) and sim.contexts == [0, 1]
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(runtime.get_device()))
    thread.start()
    thread.join()
    assert seen == [0], "the current device is per thread"


def test_an_event_records_only_on_its_own_devices_streams_but_is_waited_on_anywhere(
    sim: Simulator,
) -> None:
    runtime = sim.runtime
    event = runtime.event_create()  # device 0
    runtime.set_device(1)
    stream1 = runtime.stream_create()
    with pytest.raises(CudaError, match="InvalidResourceHandle"):
        runtime.event_record(event, stream1)
    runtime.set_device(0)
    stream0 = runtime.stream_create()
    runtime.event_record(event, stream0)
    runtime.stream_wait_event(stream1, event)  # another device's stream may wait
    assert runtime.event_query(event) in (True, False)


def test_the_legacy_stream_orders_with_blocking_streams_only(sim: Simulator) -> None:
    runtime = sim.runtime
    a = runtime.malloc(256)
    blocking = sim.cudaStreamCreateWithFlags(0)[1]
    non_blocking = runtime.stream_create()
    sim.launch(blocking, fill(1), writes=[(a, 256)])
    sim.launch(0, fill(2), writes=[(a, 256)])
    assert sim.races == [], "legacy work waits for the blocking stream's"
    sim.launch(non_blocking, fill(3), writes=[(a, 256)])
    assert [(r.first.split()[1], r.second.split()[1]) for r in sim.races] == [
        ("fill2", "fill3"), ("fill1", "fill3")], "a non-blocking stream orders with neither"
    sim.launch(2, fill(4), writes=[(a, 256)])  # per-thread: after legacy, not non-blocking
    assert [r.first.split()[1] for r in sim.races[2:]] == ["fill3"]


def test_work_runs_later_in_stream_order_and_at_synchronisation(sim: Simulator) -> None:
    runtime = sim.runtime
    a = runtime.malloc(64)
    stream = runtime.stream_create()
    sim.hold(stream)
    for value in range(1, 6):
        sim.launch(stream, fill(value), writes=[(a, 64)])
    assert sim.read(a, 1) == b"\0", "nothing ran while the stream is held"
    assert sim.cudaStreamQuery(stream)[0] == cudaError_t.cudaErrorNotReady
    sim.hold(stream, False)
    runtime.stream_synchronize(stream)
    assert sim.read(a, 64) == b"\5" * 64 and sim.cudaStreamQuery(stream) == (OK,)


def test_the_seed_chooses_the_interleaving_and_repeats_it() -> None:
    def order(seed: int) -> list[int]:
        sim = Simulator(devices=1, memory="1MiB", seed=seed)
        ran: list[int] = []
        streams = [sim.cudaStreamCreateWithFlags(1)[1] for _ in range(4)]
        for i in range(40):
            sim.launch(streams[i % 4], lambda i=i: ran.append(i))
        sim.synchronize()
        sim.close()
        return ran

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(3)) == list(range(40))


def test_a_block_reused_on_another_stream_without_waiting_is_a_race(sim: Simulator) -> None:
    runtime = sim.runtime
    a = runtime.malloc(128)
    s1, s2 = runtime.stream_create(), runtime.stream_create()
    sim.launch(s1, fill(1), writes=[(a, 128)])
    event = runtime.event_create()
    runtime.event_record(event, s1)
    runtime.stream_wait_event(s2, event)
    sim.launch(s2, fill(2), reads=[(a, 128)], writes=[(a + 64, 64)])
    assert sim.races == [], "ordered by the event"
    s3 = runtime.stream_create()
    sim.launch(s3, fill(3), reads=[(a, 8)])
    assert [r.nbytes for r in sim.races] == [8]
    runtime.stream_synchronize(s2)  # the host saw s2's work, and s1's before it
    sim.launch(s3, fill(4), writes=[(a, 128)])
    assert len(sim.races) == 1
    sim.write(a, b"x")  # s3's kernel has not been seen to finish
    assert [(r.first.split()[1], r.second) for r in sim.races[1:]] == [
        ("fill3", "host write"), ("fill4", "host write")]


def test_async_copies_stage_pageable_sources_and_wait_for_pageable_targets(
    sim: Simulator,
) -> None:
    runtime = sim.runtime
    device = runtime.malloc(16)
    pinned = runtime.host_alloc(16)
    stream = runtime.stream_create()
    sim.hold(stream)
    source = np.arange(16, dtype=np.uint8)
    runtime.memcpy_async(device, source.ctypes.data, 16, stream)
    source[:] = 0  # CUDA staged the pageable source already
    runtime.memcpy_async(pinned, device, 16, stream)
    sim.hold(stream, False)
    runtime.stream_synchronize(stream)
    assert sim.read(pinned, 16) == bytes(range(16))
    target = np.zeros(16, dtype=np.uint8)
    runtime.memcpy_async(target.ctypes.data, device, 16, stream)
    assert target.tobytes() == bytes(range(16)), "a pageable target is copied before return"
    runtime.free_host(pinned)
    runtime.free(device)
    with pytest.raises(CudaError, match="InvalidValue"):
        runtime.memcpy(target.ctypes.data, device, 16)  # freed: refused, not crashed


def test_memset_is_asynchronous_on_device_memory(sim: Simulator) -> None:
    runtime = sim.runtime
    a = runtime.malloc(32)
    sim.hold(0)
    runtime.memset(a, 7, 32)
    assert sim.read(a, 32) == bytes(32)
    sim.hold(0, False)
    runtime.device_synchronize()
    assert sim.read(a, 32) == b"\7" * 32


def test_memory_calls_count_refuse_and_run_out(sim: Simulator) -> None:
    runtime = sim.runtime
    assert runtime.mem_get_info() == (1 << 20, 1 << 20)
    a = runtime.malloc(1000)
    assert a % 256 == 0 and sim.used == [1024, 0] and sim.live()[a].kind == "device"
    with pytest.raises(CudaError, match="MemoryAllocation"):
        runtime.malloc(1 << 20)
    with pytest.raises(CudaError, match="InvalidValue"):
        runtime.free(a + 256)
    runtime.free(a)
    runtime.free(0)  # the context-making idiom
    with pytest.raises(CudaError, match="InvalidValue"):
        runtime.free(a)
    assert sim.used == [0, 0] and sim.live() == {}
    sim.fail["cudaMalloc"] = cudaError_t.cudaErrorInvalidValue
    with pytest.raises(CudaError, match="cudaMalloc"):
        runtime.malloc(8)
    assert runtime.malloc(8) and "cudaGetLastError" in sim.names()


def test_registration_overlap_is_error_712_and_unknown_start_713(sim: Simulator) -> None:
    runtime = sim.runtime
    buffer = np.zeros(3 * 4096, dtype=np.uint8)
    base = buffer.ctypes.data
    runtime.host_register(base, 8192)
    with pytest.raises(CudaError) as overlap:
        runtime.host_register(base + 4096, 8192)
    assert overlap.value.status == 712
    with pytest.raises(CudaError) as unknown:
        runtime.host_unregister(base + 4096)
    assert unknown.value.status == 713
    assert sim.registered == {base: 8192}
    runtime.host_unregister(base)
    assert sim.registered == {}


@pytest.mark.parametrize("api", ["12.0", "12.2", "13"])
def test_managed_hints_in_each_cuda_signature(api: str) -> None:
    sim = Simulator(devices=2, memory="1MiB", api=api)
    runtime = CudaRuntime(sim)
    address = runtime.malloc_managed(8192)
    runtime.mem_advise(address, 4096, 3, 1)
    runtime.mem_prefetch(address, 8192, -1, 0)
    assert sim.advice == [(address, 4096, 3, 1)]
    assert sim.prefetches == [(address, 8192, -1, 0)]
    with pytest.raises(CudaError, match="InvalidValue"):
        runtime.mem_advise(runtime.malloc(256), 256, 3, 1)  # not managed memory
    assert ("cudaMemAdvise_v2" in dir(sim)) == (api == "12.2")
    sim.close()


def test_touching_freed_or_null_memory_poisons_the_device(sim: Simulator) -> None:
    runtime = sim.runtime
    a = runtime.malloc(64)
    stream = runtime.stream_create()
    sim.hold(stream)
    sim.launch(stream, fill(1), writes=[(a, 64)])
    sim.hold(stream, False)
    runtime.free(a)  # waits for the kernel: legal
    assert sim.sticky == [None, None]
    sim.launch(stream, fill(1), writes=[(a, 64)])
    with pytest.raises(CudaError, match="IllegalAddress"):
        runtime.stream_synchronize(stream)
    with pytest.raises(CudaError, match="IllegalAddress"):
        runtime.malloc(8)  # sticky: the context is gone
    runtime.set_device(1)
    runtime.free(runtime.malloc(8))  # the other device is fine
    sim.launch(0, fill(1), writes=[(0, 4)])
    with pytest.raises(CudaError, match="IllegalAddress"):
        runtime.device_synchronize()


def test_reading_outside_the_simulators_memory_is_refused(sim: Simulator) -> None:
    with pytest.raises(InvalidAddressError):
        sim.read(ctypes.addressof(ctypes.c_int(0)), 4)
    with pytest.raises(InvalidArgumentError):
        Simulator(api="11.8")
    with pytest.raises(InvalidArgumentError):
        sim.launch(0, fill(1), writes=[(1, -1)])


def test_no_driver_and_no_device() -> None:
    assert not CudaRuntime(Simulator(driver=False)).available()
    assert not CudaRuntime(Simulator(devices=0)).available()
    assert CudaRuntime(Simulator(devices=1)).available()


def test_cuda_streams_over_the_simulator_wait_across_devices() -> None:
    with simulated(devices=2, memory="1MiB", seed=3) as sim:
        runtime = cuda_runtime()
        a = runtime.malloc(256)
        producer = CudaStream()
        runtime.set_device(1)
        consumer = CudaStream()
        runtime.set_device(0)
        sim.launch(producer, fill(9), writes=[(a, 256)])
        runtime.set_device(1)
        consumer.wait(producer.record())
        b = runtime.malloc(256)
        runtime.memcpy_async(b, a, 256, consumer.handle)
        consumer.synchronize()
        assert sim.read(b, 256) == b"\x09" * 256 and sim.races == []


def test_a_synchronous_copy_makes_what_it_waited_for_seen_by_the_host(sim: Simulator) -> None:
    runtime = sim.runtime
    a, b = runtime.malloc(64), runtime.malloc(64)
    s1, s2 = runtime.stream_create(), runtime.stream_create()
    sim.launch(s1, fill(1), writes=[(a, 64)])
    event = runtime.event_create()
    runtime.event_record(event, s1)
    runtime.stream_wait_event(s2, event)
    host = np.zeros(64, np.uint8)
    runtime.memcpy_async(host.ctypes.data, b, 64, s2)  # pageable target: waited for
    sim.launch(s2, fill(3), writes=[(b, 64)])  # queued after the copy: not yet seen
    sim.write(a, b"\2" * 64)  # s1's kernel finished before the copy the host waited for
    assert sim.races == []


def test_launch_takes_any_stream_a_framework_hands_out(sim: Simulator) -> None:
    runtime = sim.runtime
    a = runtime.malloc(16)
    handle = runtime.stream_create()

    class TorchLike:
        cuda_stream = handle

    sim.launch(TorchLike(), fill(4), writes=[(a, 16)])
    sim.launch(None, fill(5), writes=[(a, 16)])  # the legacy stream: a race with the other
    with pytest.raises(CudaError, match="InvalidResourceHandle"):
        sim.launch(0x999, fill(6), writes=[(a, 16)])
    with pytest.raises(InvalidArgumentError):
        sim.launch(-3, fill(6))
    runtime.device_synchronize()
    assert sim.read(a, 16) in (b"\4" * 16, b"\5" * 16) and len(sim.races) == 1
