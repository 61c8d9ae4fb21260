"""tensorarena — the memory manager of a machine-learning runtime.

``import tensorarena`` needs only NumPy; PyTorch, ONNX, CUDA and plotting are optional extras,
imported where they are used.
"""

from tensorarena._version import __version__
from tensorarena.adaptors import Limiting, Statistics, ThreadCached, ThreadSafe
from tensorarena.core import STRATEGIES, Arena, ArenaStatistics, PlacementStrategy
from tensorarena.errors import (
    DoubleFreeError,
    InfeasibleError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidPlanError,
    InvalidProblemError,
    InvalidSizeError,
    MissingDependencyError,
    OutOfMemoryError,
    SizeMismatchError,
    TensorArenaError,
    TensorArenaWarning,
)
from tensorarena.interop import (
    default_resource,
    empty,
    scope,
    set_default_resource,
    zeros,
)
from tensorarena.memory import (
    HostMemory,
    MemoryResource,
    PinnedHostMemory,
    Pool,
    VirtualMemory,
    memory_summary,
)
from tensorarena.sizes import format_size, parse_size

__all__ = [
    "STRATEGIES",
    "Arena",
    "ArenaStatistics",
    "DoubleFreeError",
    "HostMemory",
    "InfeasibleError",
    "InvalidAddressError",
    "InvalidAlignmentError",
    "InvalidPlanError",
    "InvalidProblemError",
    "InvalidSizeError",
    "Limiting",
    "MemoryResource",
    "MissingDependencyError",
    "OutOfMemoryError",
    "PinnedHostMemory",
    "PlacementStrategy",
    "Pool",
    "SizeMismatchError",
    "Statistics",
    "TensorArenaError",
    "TensorArenaWarning",
    "ThreadCached",
    "ThreadSafe",
    "VirtualMemory",
    "__version__",
    "default_resource",
    "empty",
    "format_size",
    "memory_summary",
    "parse_size",
    "scope",
    "set_default_resource",
    "zeros",
]
