"""The device registry over simulated devices (host memory) and over the simulated CUDA runtime:
one pool per device, the current device by default, and a free into the wrong pool refused."""

from __future__ import annotations

import threading

import pytest

from tensorarena.errors import DeviceMismatchError, InvalidAddressError, InvalidArgumentError
from tensorarena.memory import (
    DeviceRegistry,
    HostMemory,
    Pool,
    device_pool,
    set_device_registry,
    use_device,
)
from tensorarena.memory.cuda import CudaRuntime
from tensorarena.testing.cuda import Simulator


class SimulatedDevices:
    """``count`` devices and a per-thread current device, as CUDA keeps it."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._current = threading.local()

    def device_count(self) -> int:
        return self.count

    def get_device(self) -> int:
        return getattr(self._current, "device", 0)

    def set_device(self, device: int) -> None:
        self._current.device = device


@pytest.fixture
def registry() -> DeviceRegistry:
    return DeviceRegistry(lambda device: Pool(HostMemory()), runtime=SimulatedDevices(3))


def test_one_pool_per_device_made_on_first_use(registry: DeviceRegistry) -> None:
    assert registry.pools() == {}
    first = registry.pool(1)
    assert registry.pool(1) is first and first.device == 1
    assert registry.pool() is registry.pool(0)  # the current device
    assert sorted(registry.pools()) == [0, 1]
    assert "DevicePool(device=1" in repr(first) and "pools=[0, 1]" in repr(registry)


def test_the_current_device_is_per_thread_and_scoped(registry: DeviceRegistry) -> None:
    with registry.use_device(2) as device:
        assert device == 2 and registry.current_device() == 2
        seen: list[int] = []
        thread = threading.Thread(target=lambda: seen.append(registry.current_device()))
        thread.start()
        thread.join()
        assert seen == [0], "another thread keeps its own current device"
    assert registry.current_device() == 0
    registry.set_device(1)
    assert registry.pool().device == 1
    for bad in (3, -1, "1", True):
        with pytest.raises(InvalidArgumentError, match="device"):
            registry.pool(bad)  # type: ignore[arg-type]


def test_a_block_freed_into_another_devices_pool_is_refused(registry: DeviceRegistry) -> None:
    zero, one = registry.pool(0), registry.pool(1)
    block = zero.allocate(4096)
    assert registry.owner_of(block) == 0
    before = zero.statistics(), one.statistics()
    with pytest.raises(DeviceMismatchError) as error:
        one.deallocate(block, 4096)
    assert (error.value.allocated_on, error.value.freed_on) == (0, 1)
    assert "device_pool(0)" in str(error.value)
    assert isinstance(error.value, InvalidAddressError)
    assert (zero.statistics(), one.statistics()) == before
    zero.deallocate(block, 4096)
    assert registry.owner_of(block) is None
    with pytest.raises(InvalidAddressError):
        one.deallocate(block, 4096)  # now simply not one's


def test_the_current_device_resource_allocates_where_it_is_called(
    registry: DeviceRegistry,
) -> None:
    resource = registry.resource()
    with registry.use_device(2):
        block = resource.allocate(1000)
    assert registry.owner_of(block) == 2
    resource.deallocate(block, 1000)  # from device 0: still freed into device 2's pool
    assert registry.pool(2).statistics().allocations.current == 0
    assert resource.memory_kind is registry.pool(0).memory_kind
    with pytest.raises(InvalidAddressError):
        resource.deallocate(block, 1000)


def test_the_default_factory_makes_cuda_pools_on_their_device() -> None:
    fake = Simulator()
    registry = DeviceRegistry(runtime=CudaRuntime(fake))
    fake.cudaFree(0)  # this thread works on device 0: it is made current again after
    block = registry.pool(1).allocate(4096)
    arena = next(iter(fake.live().values()))
    assert arena.device == 1, "the arena came from device 1"
    assert registry.current_device() == 0
    registry.pool(1).deallocate(block, 4096)
    fake.close()


def test_the_process_registry_is_replaceable(registry: DeviceRegistry) -> None:
    previous = set_device_registry(registry)
    try:
        with use_device(1):
            assert device_pool() is registry.pool(1)
        with pytest.raises(InvalidArgumentError):
            set_device_registry(object())  # type: ignore[arg-type]
    finally:
        set_device_registry(previous)


def test_factories_are_checked() -> None:
    with pytest.raises(InvalidArgumentError):
        DeviceRegistry("pool")  # type: ignore[arg-type]
    registry = DeviceRegistry(lambda device: HostMemory, runtime=SimulatedDevices(1))  # type: ignore[arg-type,return-value]
    from tensorarena.errors import InvalidResourceError

    with pytest.raises(InvalidResourceError):
        registry.pool(0)



def test_the_pinned_pool_refuses_a_cap_it_cannot_honour_instead_of_ignoring_it() -> None:
    from tensorarena.errors import InvalidSizeError
    from tensorarena.memory.devices import pinned_pool

    pool = pinned_pool()  # made on first use (or by an earlier test): its cap is fixed now
    assert isinstance(pool, Pool)
    with pytest.raises(InvalidSizeError):
        pinned_pool(maximum_size="lots")
    other = (pool.maximum_size or 0) + 4096
    with pytest.raises(InvalidArgumentError, match="exists already"):
        pinned_pool(maximum_size=other)
    assert pinned_pool() is pool
    if pool.maximum_size is not None:
        assert pinned_pool(maximum_size=pool.maximum_size) is pool


class _ReuseOnFree:
    """A pool whose deallocate, once the block is freed, lets ``then()`` run: another thread
    being handed the same address at that moment, made deterministic."""

    def __init__(self) -> None:
        self.pool = Pool(HostMemory())
        self.memory_kind = self.pool.memory_kind
        self.then: list[object] = []

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return self.pool.allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.pool.deallocate(address, nbytes, stream)
        while self.then:
            self.then.pop()()  # type: ignore[operator]


def test_an_address_handed_out_again_during_a_free_keeps_its_new_owner() -> None:
    # The owner was forgotten after the upstream free, so an address reused in between lost
    # its owner: a later free of it into another device's pool was not named a mismatch.
    upstream = _ReuseOnFree()
    registry = DeviceRegistry(lambda device: upstream, runtime=SimulatedDevices(2))
    pool = registry.pool(0)
    first = pool.allocate(4096)
    again: list[int] = []
    upstream.then.append(lambda: again.append(pool.allocate(4096)))
    pool.deallocate(first, 4096)
    assert again == [first] and registry.owner_of(first) == 0
    with pytest.raises(DeviceMismatchError):
        registry.pool(1).deallocate(first, 4096)
    with pytest.raises(InvalidAddressError):
        pool.deallocate(first + 1, 4096)  # refused upstream: nothing recorded for it
    assert registry.owner_of(first + 1) is None and registry.owner_of(first) == 0
    with pytest.raises(InvalidAddressError):
        pool.deallocate(first, 100)  # a size mismatch upstream: the owner is kept
    assert registry.owner_of(first) == 0
    pool.deallocate(first, 4096)
    assert registry.owner_of(first) is None
