"""Where bytes come from: resources (host, pinned, NUMA, virtual) and pools over them; one pool
per device (``device_pool``). CUDA resources live in :mod:`tensorarena.memory.cuda`."""

from tensorarena.memory.devices import (
    CurrentDevice,
    DevicePool,
    DeviceRegistry,
    DeviceRuntime,
    current_device,
    device_pool,
    device_registry,
    pinned_pool,
    set_device,
    set_device_registry,
    use_device,
)
from tensorarena.memory.growth import (
    Doubling,
    Fixed,
    GrowthPolicy,
    NextPowerOfTwo,
    SameAsRequested,
    Segments,
)
from tensorarena.memory.host import HUGE_PAGE_SIZE, PAGE_SIZE, HostMemory
from tensorarena.memory.numa import NumaNode, NumaTopology, current_cpu
from tensorarena.memory.pinned import (
    LockedHostMemory,
    MlockBackend,
    PinnedHostMemory,
    PinningBackend,
    locked_bytes,
    memlock_limit,
)
from tensorarena.memory.pool import ArenaSnapshot, Pool
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryKind,
    MemoryResource,
    Stream,
    check_resource,
)
from tensorarena.memory.virtual import VirtualMemory

__all__ = [
    "DEFAULT_ALIGNMENT",
    "HUGE_PAGE_SIZE",
    "PAGE_SIZE",
    "ArenaSnapshot",
    "CurrentDevice",
    "DevicePool",
    "DeviceRegistry",
    "DeviceRuntime",
    "Doubling",
    "Fixed",
    "GrowthPolicy",
    "HostMemory",
    "LockedHostMemory",
    "MemoryKind",
    "MemoryResource",
    "MlockBackend",
    "NextPowerOfTwo",
    "NumaNode",
    "NumaTopology",
    "PinnedHostMemory",
    "PinningBackend",
    "Pool",
    "SameAsRequested",
    "Segments",
    "Stream",
    "VirtualMemory",
    "check_resource",
    "current_cpu",
    "current_device",
    "device_pool",
    "device_registry",
    "locked_bytes",
    "memlock_limit",
    "pinned_pool",
    "set_device",
    "set_device_registry",
    "use_device",
]
