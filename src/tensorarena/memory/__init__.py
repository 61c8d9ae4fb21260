"""Where bytes come from: resources (host, pinned, NUMA, virtual) and pools over them."""

from tensorarena.memory.growth import (
    Doubling,
    Fixed,
    GrowthPolicy,
    NextPowerOfTwo,
    SameAsRequested,
)
from tensorarena.memory.host import HUGE_PAGE_SIZE, PAGE_SIZE, HostMemory
from tensorarena.memory.numa import NumaNode, NumaTopology, current_cpu
from tensorarena.memory.pinned import (
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
    "Doubling",
    "Fixed",
    "GrowthPolicy",
    "HostMemory",
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
    "Stream",
    "VirtualMemory",
    "check_resource",
    "current_cpu",
    "locked_bytes",
    "memlock_limit",
]
