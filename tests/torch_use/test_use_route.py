"""``tensorarena.torch.use``: real tensors on a real pool, each block back to whoever made it
(torch/route.py, interop/_torch_cpu_routes.cpp)."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _use_resources import FailAfter  # noqa: E402

import tensorarena as ta  # noqa: E402
from tensorarena.errors import (  # noqa: E402
    ConcurrentUseError,
    DeviceUnavailableError,
    InvalidArgumentError,
    NotHostAccessibleError,
    UnsupportedError,
)
from tensorarena.torch import Route, memory_stats, routed_blocks, use  # noqa: E402

pytestmark = pytest.mark.torch


def live(pool: Any) -> int:
    return int(pool.statistics().allocations.current)


def inside(pool: Any, tensor: Any) -> bool:
    return tensor.data_ptr() in {b.address for b in ta.report.snapshot(pool).blocks()}


@pytest.fixture
def pool(shim: Any) -> Any:
    made = ta.Pool(ta.HostMemory())
    yield made
    gc.collect()
    assert live(made) == 0


def test_tensors_made_inside_come_from_the_resource_and_go_back(pool: Any) -> None:
    before = torch.ones(1000)
    with use(pool) as route:
        made = torch.full((300, 7), 3.0)
        product = made.T @ made  # a kernel's result
        assert live(pool) == 2 and inside(pool, made) and inside(pool, product)
        assert not inside(pool, before)
        assert made.data_ptr() % 64 == 0
    assert not route.installed
    after = torch.ones(10)
    assert not inside(pool, after)
    assert torch.equal(product, torch.full((7, 7), 2700.0))
    stats = route.statistics()
    assert stats.allocations.current == 2 and stats.allocated_bytes.current == 300 * 7 * 4 + 196
    del made, product
    assert live(pool) == 0 and route.statistics().allocations.total == 2
    assert route.statistics().allocations.current == 0


def test_frees_cross_the_boundary_both_ways(pool: Any) -> None:
    outside = torch.ones(4096)
    route = use(pool)
    inner = torch.ones(4096)
    del outside  # made by torch, freed while the route is in place: back to torch
    assert live(pool) == 1
    route.uninstall()
    del inner  # made by the route, freed after: back to the pool
    assert live(pool) == 0 and routed_blocks() == 0


def test_a_zero_byte_tensor_stays_torchs(pool: Any) -> None:
    with use(pool) as route:
        empty = torch.empty(0)
        one = torch.empty(1, dtype=torch.uint8)
    assert empty.numel() == 0 and route.statistics().allocations.total == 1
    assert one.data_ptr() % 64 == 0


def test_every_allocation_asks_torchs_alignment(pool: Any) -> None:
    asking = FailAfter(pool, 10)
    with use(asking):
        kept = [torch.empty(n, dtype=torch.uint8) for n in (1, 63, 64, 65)]
    assert asking.alignments == [64] * 4
    assert all(t.data_ptr() % 64 == 0 for t in kept)


def test_the_routes_nest_and_the_innermost_wins(shim: Any) -> None:
    outer_pool, inner_pool = ta.Pool(ta.HostMemory()), ta.Pool(ta.HostMemory())
    with use(outer_pool) as outer:
        a = torch.ones(100)
        with use(inner_pool) as inner:
            b = torch.ones(100)
        c = torch.ones(100)
    d = torch.ones(100)
    assert (live(outer_pool), live(inner_pool)) == (2, 1)
    assert inside(outer_pool, a) and inside(inner_pool, b) and inside(outer_pool, c)
    assert not inside(outer_pool, d) and not inside(inner_pool, d)
    assert not outer.installed and not inner.installed
    del a, b, c
    assert (live(outer_pool), live(inner_pool)) == (0, 0)


def test_uninstalling_an_outer_route_first_leaves_the_inner_one_serving(shim: Any) -> None:
    first, second = ta.Pool(ta.HostMemory()), ta.Pool(ta.HostMemory())
    one = use(first)
    two = use(second)
    one.uninstall()
    x = torch.ones(64)
    assert inside(second, x) and two.installed
    two.uninstall()
    two.uninstall()  # a second uninstall does nothing
    y = torch.ones(64)
    assert not inside(first, y) and not inside(second, y)
    with pytest.raises(ConcurrentUseError, match="installed already"), use(first) as again:
        again.install()
    del x


def test_a_route_uninstalled_with_live_tensors_keeps_its_resource_until_they_die(
        shim: Any) -> None:
    pool = ta.Pool(ta.HostMemory())
    watch = weakref.ref(pool)
    with use(pool):
        kept = torch.arange(10_000, dtype=torch.float64)
    del pool
    gc.collect()
    assert watch() is not None  # the tensor's block holds the route, the route the pool
    kept.mul_(2)
    assert float(kept.sum()) == 2 * sum(range(10_000))
    del kept
    gc.collect()
    assert watch() is None


def test_an_exception_inside_uninstalls_and_passes(pool: Any) -> None:
    with pytest.raises(ValueError, match="inside"), use(pool) as route:
        made = torch.ones(50)
        raise ValueError("inside")
    assert not route.installed and inside(pool, made)
    assert not inside(pool, torch.ones(50))
    del made


def test_a_refusal_is_torchs_out_of_memory_error_and_changes_nothing(pool: Any) -> None:
    refusing = FailAfter(pool, 1)
    with use(refusing) as route:
        first = torch.ones(256)
        with pytest.raises(torch.OutOfMemoryError, match="refused by FailAfter"):
            torch.ones(256)
        with pytest.raises(RuntimeError, match="could not allocate 1024 bytes"):
            torch.empty(1024, dtype=torch.uint8)
    assert isinstance(route.last_error, ta.OutOfMemoryError)
    stats = route.statistics()
    assert stats.num_ooms == 2 and stats.allocations.current == 1 and live(pool) == 1
    assert float(first.sum()) == 256
    del first


class Misaligned:
    """Hands out the pool's block plus one byte: not an address torch may use."""

    memory_kind = ta.MemoryKind.HOST

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.returned: list[int] = []

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return int(self.pool.allocate(nbytes + 1, alignment)) + 1

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.returned.append(address)
        self.pool.deallocate(address - 1, nbytes + 1)


def test_a_misaligned_address_is_given_back_and_refused(pool: Any) -> None:
    resource = Misaligned(pool)
    with use(resource), pytest.raises(torch.OutOfMemoryError, match="not an address aligned"):
        torch.empty(100)
    assert len(resource.returned) == 1 and live(pool) == 0


def test_the_calling_thread_option_leaves_other_threads_to_torch(pool: Any) -> None:
    elsewhere: list[Any] = []

    def make() -> None:
        elsewhere.append(torch.ones(128))

    for threads, routed in (("calling", False), ("all", True)):
        with use(pool, threads=threads) as route:
            here = torch.ones(128)
            worker = threading.Thread(target=make)
            worker.start()
            worker.join()
        assert inside(pool, here)
        assert inside(pool, elsewhere[-1]) is routed, threads
        assert route.threads == threads
        del here
    elsewhere.clear()


def test_a_calling_thread_route_is_uninstalled_from_its_thread(pool: Any) -> None:
    route = use(pool, threads="calling")
    errors: list[BaseException] = []

    def other() -> None:
        try:
            route.uninstall()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert isinstance(errors[0], ConcurrentUseError) and route.installed
    route.uninstall()


def test_a_thread_that_ends_with_its_route_installed_lets_it_go(pool: Any, shim: Any) -> None:
    made: list[Any] = []
    routes: list[Any] = []

    def forgetful() -> None:
        routes.append(use(pool, threads="calling"))  # installed, never uninstalled
        made.append(torch.ones(1000))

    assert not shim.installed()
    worker = threading.Thread(target=forgetful)
    worker.start()
    worker.join()
    route = routes.pop()
    assert not route.installed and not shim.installed()  # torch's allocator is back
    assert inside(pool, made[0]) and float(made[0].sum()) == 1000.0  # still valid
    here = torch.ones(1000)
    assert not inside(pool, here)  # the main thread was never routed
    made.clear()
    assert live(pool) == 0  # the thread's tensor went back to the pool
    holder = weakref.ref(route)
    del route
    gc.collect()
    assert holder() is None  # nothing keeps the route (and its resource) alive


def test_threads_allocating_and_freeing_at_once_lose_nothing(pool: Any) -> None:
    def churn(seed: int) -> None:
        kept = []
        for i in range(200):
            kept.append(torch.full((seed + i % 7 + 1,), float(seed)))
            if len(kept) > 5:
                assert float(kept.pop(0)[0]) == seed
    with use(pool) as route:
        workers = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert route.statistics().allocations.total >= 800 and live(pool) == 0


def test_memory_stats_speak_pytorchs_keys(pool: Any) -> None:
    with use(pool) as route:
        a = torch.empty(1000, dtype=torch.uint8)
        b = torch.empty(3000, dtype=torch.uint8)
    del a
    flat = memory_stats(route)
    assert flat["allocation.all.current"] == 1 and flat["allocation.all.peak"] == 2
    assert flat["allocated_bytes.all.current"] == 3000 and flat["allocated_bytes.all.peak"] == 4000
    assert flat["active_bytes.all.current"] == 3000 and flat["num_ooms"] == 0
    assert flat["reserved_bytes.all.current"] == pool.statistics().reserved_bytes.current > 0
    assert memory_stats(pool) == ta.memory_stats(pool)
    assert "route.num_ooms" not in flat and "num_deferred_frees" in flat
    assert "Route" in ta.memory_summary(route)
    route.reset_peak_stats()
    assert route.statistics().allocated_bytes.peak == 3000
    del b


def test_the_pools_memory_history_sees_the_programs_allocations(pool: Any) -> None:
    ta.report.record_memory_history(resource=pool)
    try:
        with use(pool) as route:
            x = torch.ones(512)
            y = x * 2
            del x
        snapshot = ta.report.memory_snapshot(pool)
    finally:
        ta.report.record_memory_history(False, resource=pool)
    trace = snapshot["device_traces"][0]
    allocs = [e["size"] for e in trace if e["action"] == "alloc"]
    frees = [e["size"] for e in trace if e["action"] == "free_completed"]
    # x and y, and the small tensors torch makes of scalars, each one seen
    assert allocs.count(2048) == 2 and frees.count(2048) == 1
    stats = route.statistics()
    assert len(allocs) == stats.allocations.total
    assert len(frees) == stats.allocations.total - stats.allocations.current
    del y


def test_bad_arguments_are_refused_before_anything_changes(shim: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="threads"):
        use(threads="some")
    with pytest.raises(InvalidArgumentError, match="device"):
        use(device="tpu")
    with pytest.raises(NotHostAccessibleError):
        use(ta.VirtualMemory())
    with pytest.raises(ta.InvalidResourceError):
        use(ta.Pool)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="calling"):
        use(device="cuda", threads="all")
    assert not shim.installed()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_device_is_refused(shim: Any) -> None:
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        use(device="cuda")


def test_the_default_resource_serves_when_none_is_given(shim: Any) -> None:
    route = Route()
    assert route.resource is ta.default_resource() and not route.installed
    with route:
        kept = torch.ones(64)
    assert "uninstalled" in repr(route) and "live=1" in repr(route)
    del kept


def test_torchs_profiler_and_the_trace_recorder_see_routed_allocations(pool: Any) -> None:
    from tensorarena.trace.torch_recorder import record_torch

    with record_torch() as recording, use(pool):
        x = torch.ones(1000)
        y = (x * 3).sum()
        del x
    sizes = [e.nbytes for e in recording.trace.events if e.op == "a"]
    assert sizes.count(4000) == 2 and float(y) == 3000
    del y


def test_memory_stats_of_a_route_over_a_resource_without_statistics(pool: Any) -> None:
    with use(FailAfter(pool, 5)) as route:
        kept = torch.empty(100, dtype=torch.uint8)
    flat = memory_stats(route)
    assert flat["allocated_bytes.all.current"] == 100 and "reserved_bytes.all.current" in flat
    bare = use(Misaligned(pool))  # keeps no statistics anywhere below
    bare.uninstall()
    assert memory_stats(bare)["allocation.all.current"] == 0
    assert "reserved_bytes.all.current" not in memory_stats(bare)
    del kept
