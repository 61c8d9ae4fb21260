"""Where bytes come from: resources (host, pinned, NUMA, virtual) and pools over them."""

from tensorarena.memory._live import ResourceStatistics
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
from tensorarena.memory.pool import Pool, PoolStatistics
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, Stream
from tensorarena.memory.summary import memory_summary
from tensorarena.memory.virtual import VirtualMemory

__all__ = [
    "DEFAULT_ALIGNMENT",
    "HUGE_PAGE_SIZE",
    "PAGE_SIZE",
    "Doubling",
    "Fixed",
    "GrowthPolicy",
    "HostMemory",
    "MemoryResource",
    "MlockBackend",
    "NextPowerOfTwo",
    "NumaNode",
    "NumaTopology",
    "PinnedHostMemory",
    "PinningBackend",
    "Pool",
    "PoolStatistics",
    "ResourceStatistics",
    "SameAsRequested",
    "Stream",
    "VirtualMemory",
    "current_cpu",
    "locked_bytes",
    "memlock_limit",
    "memory_summary",
]
