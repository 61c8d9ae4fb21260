"""Device affinity: one pool per device, the current device by default, frees checked.

The source document asks that memory be allocated on the device that computes. A
:class:`DeviceRegistry` keeps one resource per device, made on first use by a factory (by
default a :class:`~tensorarena.memory.Pool` over :class:`~tensorarena.memory.cuda.CudaMemory`),
and follows the runtime's notion of the *current* device (``cudaSetDevice``, per thread):

* ``registry.pool(device)`` is that device's :class:`DevicePool`; ``pool()`` the current
  device's;
* ``registry.resource()`` allocates from whichever device is current at each call and frees a
  block into the pool that made it;
* freeing a block into another device's pool raises
  :class:`~tensorarena.errors.DeviceMismatchError` naming both devices, before anything changes
  (a pool would only say "not mine"; the registry knows whose it is).

The registry needs three calls of a runtime (``device_count``, ``get_device``, ``set_device``):
the CUDA runtime on a GPU; in tests, a simulated set of devices over host memory, which is how
the whole registry is exercised without one. ``device_pool()``, ``current_device()``,
``use_device()`` and ``pinned_pool()`` work on the process's registry, made on first use.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tensorarena.errors import DeviceMismatchError, InvalidArgumentError
from tensorarena.memory.growth import Doubling
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryKind,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import Size, check_address, parse_size

__all__ = [
    "CurrentDevice",
    "DevicePool",
    "DeviceRegistry",
    "DeviceRuntime",
    "current_device",
    "device_pool",
    "device_registry",
    "pinned_pool",
    "set_device",
    "set_device_registry",
    "use_device",
]


class DeviceRuntime(Protocol):
    """What a registry asks of a runtime (``CudaRuntime`` answers all three)."""

    def device_count(self) -> int:
        """How many devices there are."""
        ...

    def get_device(self) -> int:
        """The calling thread's current device."""
        ...

    def set_device(self, device: int) -> None:
        """Make ``device`` the calling thread's current device."""
        ...


def _cuda_pool(runtime: Any) -> Callable[[int], MemoryResource]:
    def make(device: int) -> MemoryResource:
        from tensorarena.memory.cuda import CudaMemory

        return Pool(
            CudaMemory(device, runtime=runtime),
            strategy="best_fit",
            initial_size="2MiB",
            growth=Doubling("1GiB"),
        )

    return make


class DevicePool(ResourceAdaptor):
    """The resource of one device in a registry: its pool, and a check on every free."""

    def __init__(self, registry: DeviceRegistry, device: int, upstream: MemoryResource) -> None:
        self._registry = registry
        self._device = device
        self._upstream = check_resource(upstream)

    @property
    def device(self) -> int:
        """The device this pool allocates on."""
        return self._device

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A block on this device."""
        address = self._upstream.allocate(nbytes, alignment, stream)
        self._registry._owned(address, self._device)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Free a block of this device; a block of another device's pool raises
        :class:`~tensorarena.errors.DeviceMismatchError`, changing nothing."""
        address = check_address(address)
        owner = self._registry.owner_of(address)
        if owner is not None and owner != self._device:
            raise DeviceMismatchError(
                f"block {address:#x} was allocated on device {owner} and is being freed into "
                f"device {self._device}'s pool: free it into device_pool({owner})",
                address=address,
                allocated_on=owner,
                freed_on=self._device,
            )
        # Forget the owner while the block is still live upstream: once it is freed, another
        # thread may be handed the same address and record its own owner, which a later
        # _released would erase.
        self._registry._released(address)
        try:
            self._upstream.deallocate(address, nbytes, stream)
        except BaseException:
            if owner is not None:
                self._registry._owned(address, owner)
            raise

    def statistics(self) -> Any:
        """The upstream's statistics record."""
        return self._upstream.statistics()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"DevicePool(device={self._device}, {self._upstream!r})"


class CurrentDevice:
    """A resource that allocates on the device current at each call and frees each block into
    the pool that made it."""

    def __init__(self, registry: DeviceRegistry) -> None:
        self._registry = registry

    @property
    def memory_kind(self) -> MemoryKind:
        """The current device's pool's kind."""
        return self._registry.pool().memory_kind

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A block from the current device's pool."""
        return self._registry.pool().allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Free the block into its own device's pool (the current one if it has none)."""
        owner = self._registry.owner_of(check_address(address))
        self._registry.pool(owner).deallocate(address, nbytes, stream)

    def __repr__(self) -> str:
        return f"CurrentDevice({self._registry!r})"


class DeviceRegistry:
    """One resource per device, made by ``factory(device)`` on first use (default: a best-fit
    Pool over CudaMemory), and the runtime's current device."""

    def __init__(
        self,
        factory: Callable[[int], MemoryResource] | None = None,
        *,
        runtime: DeviceRuntime | None = None,
    ) -> None:
        if factory is not None and not callable(factory):
            raise InvalidArgumentError(f"factory must be callable, not {factory!r}")
        self._factory = factory
        self._runtime = runtime
        self._pools: dict[int, DevicePool] = {}
        self._owners: dict[int, int] = {}  # live address -> device
        self._lock = threading.Lock()

    @property
    def runtime(self) -> DeviceRuntime:
        """The runtime asked for devices (the CUDA runtime unless one was given)."""
        if self._runtime is None:
            from tensorarena.memory.cuda import cuda_runtime

            self._runtime = cuda_runtime()
        return self._runtime

    def device_count(self) -> int:
        """How many devices the runtime sees."""
        return self.runtime.device_count()

    def current_device(self) -> int:
        """The calling thread's current device."""
        return self.runtime.get_device()

    def set_device(self, device: int) -> None:
        """Make ``device`` current for the calling thread."""
        self.runtime.set_device(self._check(device))

    @contextlib.contextmanager
    def use_device(self, device: int) -> Iterator[int]:
        """Make ``device`` current inside the block (the previous one after)."""
        device = self._check(device)
        previous = self.current_device()
        self.runtime.set_device(device)
        try:
            yield device
        finally:
            self.runtime.set_device(previous)

    def pool(self, device: int | None = None) -> DevicePool:
        """The pool of ``device`` (default: the current device), made on first use."""
        device = self.current_device() if device is None else self._check(device)
        pool = self._pools.get(device)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(device)
            if pool is None:
                factory = self._factory or _cuda_pool(self.runtime)
                pool = DevicePool(self, device, factory(device))
                self._pools[device] = pool
            return pool

    def pools(self) -> dict[int, DevicePool]:
        """The pools made so far, by device."""
        with self._lock:
            return dict(self._pools)

    def resource(self) -> CurrentDevice:
        """A resource over the current device's pool (see :class:`CurrentDevice`)."""
        return CurrentDevice(self)

    def owner_of(self, address: int) -> int | None:
        """The device whose pool handed out the live block at ``address``, if any."""
        return self._owners.get(address)

    def __repr__(self) -> str:
        return f"DeviceRegistry(pools={sorted(self._pools)})"

    # --- internals ---------------------------------------------------------------------------

    def _check(self, device: object) -> int:
        if isinstance(device, bool) or not isinstance(device, int):
            raise InvalidArgumentError(f"device must be an int, not {device!r}")
        count = self.device_count()
        if not 0 <= device < count:
            seen = f"there are {count} (0..{count - 1})" if count else "none is visible"
            raise InvalidArgumentError(f"no device {device}: {seen}")
        return int(device)

    def _owned(self, address: int, device: int) -> None:
        with self._lock:
            self._owners[address] = device

    def _released(self, address: int) -> None:
        with self._lock:
            self._owners.pop(address, None)


# --- the process's registry and pinned pool -------------------------------------------------------

_lock = threading.Lock()
_registry: DeviceRegistry | None = None
_pinned: Pool | None = None


def device_registry() -> DeviceRegistry:
    """The process's registry (CUDA pools, made on first use)."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = DeviceRegistry()
        return _registry


def set_device_registry(registry: DeviceRegistry | None) -> DeviceRegistry | None:
    """Use ``registry`` as the process's (``None``: a fresh CUDA one when next asked); return
    the previous one."""
    global _registry
    if registry is not None and not isinstance(registry, DeviceRegistry):
        raise InvalidArgumentError(f"expected a DeviceRegistry, not {type(registry).__name__}")
    with _lock:
        previous, _registry = _registry, registry
    return previous


def device_pool(device: int | None = None) -> DevicePool:
    """The pool of ``device`` (default: the current one) in the process's registry."""
    return device_registry().pool(device)


def current_device() -> int:
    """The calling thread's current device."""
    return device_registry().current_device()


def set_device(device: int) -> None:
    """Make ``device`` current for the calling thread."""
    device_registry().set_device(device)


def use_device(device: int) -> contextlib.AbstractContextManager[int]:
    """``with use_device(1): ...`` allocates on device 1 inside the block."""
    return device_registry().use_device(device)


def pinned_pool(*, maximum_size: Size | None = None) -> MemoryResource:
    """The process's dedicated pool of pinned host memory (driver-pinned where CUDA is present),
    made on first use: the staging buffers of transfers come from here. ``maximum_size`` caps it
    (pinned memory is scarce); it is set when the pool is made, so asking for another cap once
    it exists raises :class:`~tensorarena.errors.InvalidArgumentError` instead of being ignored."""
    global _pinned
    cap = None if maximum_size is None else parse_size(maximum_size, name="maximum_size")
    with _lock:
        if _pinned is not None and cap is not None and cap != _pinned.maximum_size:
            raise InvalidArgumentError(
                f"the pinned pool exists already with maximum_size {_pinned.maximum_size}; "
                f"it cannot be made again with {cap}"
            )
        if _pinned is None:
            from tensorarena.memory.pinned import PinnedHostMemory

            _pinned = Pool(
                PinnedHostMemory(),
                strategy="best_fit",
                initial_size=0,
                growth=Doubling("256MiB"),
                maximum_size=cap,
            )
        return _pinned
