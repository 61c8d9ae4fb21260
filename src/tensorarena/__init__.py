"""tensorarena — the memory manager of a machine-learning runtime.

``import tensorarena`` needs only NumPy; PyTorch, ONNX, CUDA and plotting are optional extras,
imported where they are used.
"""

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
from tensorarena.sizes import format_size, parse_size

__version__ = "0.1.0"

__all__ = [
    "STRATEGIES",
    "Arena",
    "ArenaStatistics",
    "DoubleFreeError",
    "InfeasibleError",
    "InvalidAddressError",
    "InvalidAlignmentError",
    "InvalidPlanError",
    "InvalidProblemError",
    "InvalidSizeError",
    "MissingDependencyError",
    "OutOfMemoryError",
    "PlacementStrategy",
    "SizeMismatchError",
    "TensorArenaError",
    "TensorArenaWarning",
    "__version__",
    "format_size",
    "parse_size",
]
