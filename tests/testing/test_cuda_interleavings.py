"""Property: random allocate / use / share / free on random streams of two simulated devices,
through the default stream-ordered pools, never corrupts a byte, never races, never deadlocks,
and ends with nothing live. Each block is filled with its own tag by a kernel on its stream, and
every later use is a kernel that checks the tag when the scheduler (seeded) gets to it."""

from __future__ import annotations

import gc
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tensorarena.interop.stream_pools import stream_ordered_pool
from tensorarena.memory import device_pool
from tensorarena.memory.cuda import CudaStream, cuda_runtime
from tensorarena.testing.cuda import simulated

STREAMS = 3

operation = st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 1), st.integers(0, STREAMS - 1),
              st.integers(1, 20_000)),
    st.tuples(st.just("use"), st.integers(0, 63)),
    st.tuples(st.just("share"), st.integers(0, 63), st.integers(0, STREAMS - 1)),
    st.tuples(st.just("free"), st.integers(0, 63)),
    st.tuples(st.just("sync"),),
)


def _filler(tag: int) -> Any:
    def fill(view: memoryview) -> None:
        view[:] = bytes([tag]) * len(view)

    return fill


def _checker(tag: int, bad: list[int]) -> Any:
    def check(view: memoryview) -> None:
        if view.tobytes() != bytes([tag]) * len(view):
            bad.append(tag)

    return check


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), operations=st.lists(operation, max_size=40))
def test_random_stream_work_on_two_devices_stays_correct(seed: int, operations: list[Any]
                                                         ) -> None:
    with simulated(devices=2, memory="8MiB", seed=seed) as sim:
        runtime = cuda_runtime()
        streams = [[CudaStream(device=d) for _ in range(STREAMS)] for d in range(2)]
        live: list[tuple[int, int, int, CudaStream, int]] = []  # address, size, device, ...
        bad: list[int] = []
        tags = iter(range(1, 10_000))
        for op in operations:
            if op[0] == "alloc":
                _, device, index, size = op
                stream = streams[device][index]
                with runtime.on_device(device):
                    address = stream_ordered_pool(device).allocate(size, stream=stream)
                    tag = next(tags) % 255 + 1
                    sim.launch(stream, _filler(tag), writes=[(address, size)])
                live.append((address, size, device, stream, tag))
            elif op[0] in ("use", "share", "free") and live:
                address, size, device, stream, tag = live[op[1] % len(live)]
                with runtime.on_device(device):
                    if op[0] == "use":
                        sim.launch(stream, _checker(tag, bad), reads=[(address, size)])
                    elif op[0] == "share":  # another stream of the device reads it too
                        other = streams[device][op[2]]
                        other.wait(stream.record())
                        stream_ordered_pool(device).record_stream(address, other)
                        sim.launch(other, _checker(tag, bad), reads=[(address, size)])
                    else:
                        stream_ordered_pool(device).deallocate(address, size, stream)
                        live.remove((address, size, device, stream, tag))
            elif op[0] == "sync":
                sim.synchronize()
        for address, size, device, stream, _ in live:
            with runtime.on_device(device):
                stream_ordered_pool(device).deallocate(address, size, stream)
        sim.synchronize()
        for device in range(2):
            pool = stream_ordered_pool(device)
            pool.synchronize()
            assert pool.live_blocks() == {}
            assert device_pool(device).statistics().allocations.current == 0
        assert bad == [], "a block's bytes changed under a user"
        assert sim.races == [], [str(r) for r in sim.races[:3]]
        assert all(s is None for s in sim.sticky)
        del streams
        gc.collect()
