"""tensorarena — the memory manager of a machine-learning runtime.

``import tensorarena`` needs only NumPy; PyTorch, ONNX, CUDA and plotting are optional extras,
imported where they are used. Every public exception of :mod:`tensorarena.errors` is here too.

Every name below loads on first use (PEP 562's module ``__getattr__``), from the module that
defines it: ``import tensorarena`` imports nothing more until a name is used, and ``tensorarena
plan`` imports the planner alone, not the pools, adaptors and reports it never touches (they
were half of its start-up, all before the CSV was read: ``bench/RESULTS.md``). The names
are listed once, in :data:`_EXPORTS`; the imports under ``TYPE_CHECKING`` repeat them for type
checkers.
"""

# The imports under TYPE_CHECKING re-export for type checkers; __all__ is built from _EXPORTS.
# ruff: noqa: F401

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tensorarena._version import __version__

if TYPE_CHECKING:
    from tensorarena.adaptors import (
        Counting,
        Guarded,
        GuardedStatistics,
        Limiting,
        Logging,
        Poisoning,
        PoisoningStatistics,
        StreamOrdered,
        StreamOrderedStatistics,
        ThreadCached,
        ThreadCacheStatistics,
        ThreadSafe,
        Tracking,
        TrafficStatistics,
    )
    from tensorarena.core import STRATEGIES, Arena, PlacementStrategy
    from tensorarena.debug import debug_level, set_debug_level
    from tensorarena.errors import (
        AsyncWorkError,
        BufferOverflowError,
        ConcurrentUseError,
        CudaError,
        DataDependentError,
        DeviceMismatchError,
        DeviceUnavailableError,
        DoubleFreeError,
        ExportFailedError,
        ExportProcessError,
        InfeasibleError,
        InvalidAddressError,
        InvalidAlignmentError,
        InvalidArgumentError,
        InvalidDtypeError,
        InvalidPlanError,
        InvalidProblemError,
        InvalidResourceError,
        InvalidSizeError,
        InvariantError,
        LeakWarning,
        MalformedTraceError,
        MemoryCorruptionError,
        MissingDependencyError,
        ModelSkippedWarning,
        NoGradWarning,
        NotHostAccessibleError,
        NumaBindError,
        OutOfMemoryError,
        PlanDoesNotFitError,
        PlanVerificationError,
        ResourceClosedError,
        ResourceInUseError,
        ScopeEscapeError,
        ShapeNotCoveredError,
        ShimUnavailableError,
        SizeMismatchError,
        StreamClosedError,
        SystemAllocatorUnavailableError,
        TensorArenaError,
        TensorArenaWarning,
        UnknownNameError,
        UnsafePickleError,
        UnsupportedError,
        UseAfterFreeError,
    )
    from tensorarena.interop import (
        DeviceArray,
        current_scope,
        default_resource,
        device_empty,
        empty,
        empty_cache,
        scope,
        set_default_resource,
        to_device,
        to_host,
        zeros,
    )
    from tensorarena.learned import LearnedPlans, LearnedPlansReport
    from tensorarena.memory import (
        HostMemory,
        LockedHostMemory,
        MemoryResource,
        PinnedHostMemory,
        Pool,
        VirtualMemory,
        current_device,
        device_pool,
        pinned_pool,
        use_device,
    )
    from tensorarena.memory_kind import MemoryKind
    from tensorarena.report import (
        dump_snapshot,
        memory_snapshot,
        memory_stats,
        memory_summary,
        record_memory_history,
        reset_peak_stats,
    )
    from tensorarena.sizes import format_size, parse_size
    from tensorarena.stats import ArenaStatistics, Count, MemoryStatistics
    from tensorarena.streams import CpuStream

#: module -> the public names it gives the package root, imported when first asked for.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "tensorarena.adaptors": (
        "Counting", "Guarded", "GuardedStatistics", "Limiting", "Logging", "Poisoning",
        "PoisoningStatistics", "StreamOrdered", "StreamOrderedStatistics", "ThreadCached",
        "ThreadCacheStatistics", "ThreadSafe", "Tracking", "TrafficStatistics",
    ),
    "tensorarena.core": (
        "STRATEGIES", "Arena", "PlacementStrategy",
    ),
    "tensorarena.debug": (
        "debug_level", "set_debug_level",
    ),
    "tensorarena.errors": (
        "AsyncWorkError", "BufferOverflowError", "ConcurrentUseError", "CudaError",
        "DataDependentError", "DeviceMismatchError", "DeviceUnavailableError",
        "DoubleFreeError", "ExportFailedError", "ExportProcessError", "InfeasibleError",
        "InvalidAddressError",
        "InvalidAlignmentError", "InvalidArgumentError", "InvalidDtypeError",
        "InvalidPlanError", "InvalidProblemError", "InvalidResourceError",
        "InvalidSizeError", "InvariantError", "LeakWarning", "MalformedTraceError",
        "MemoryCorruptionError", "MissingDependencyError", "ModelSkippedWarning",
        "NoGradWarning", "NotHostAccessibleError", "NumaBindError", "OutOfMemoryError",
        "PlanDoesNotFitError", "PlanVerificationError", "ResourceClosedError",
        "ResourceInUseError", "ScopeEscapeError", "ShapeNotCoveredError",
        "ShimUnavailableError", "SizeMismatchError", "StreamClosedError",
        "SystemAllocatorUnavailableError", "TensorArenaError", "TensorArenaWarning",
        "UnknownNameError", "UnsafePickleError", "UnsupportedError", "UseAfterFreeError",
    ),
    "tensorarena.interop": (
        "DeviceArray", "current_scope", "default_resource", "device_empty", "empty", "empty_cache",
        "scope", "set_default_resource", "to_device", "to_host", "zeros",
    ),
    "tensorarena.learned": (
        "LearnedPlans", "LearnedPlansReport",
    ),
    "tensorarena.memory": (
        "HostMemory", "LockedHostMemory", "MemoryResource", "PinnedHostMemory", "Pool",
        "VirtualMemory", "current_device", "device_pool", "pinned_pool", "use_device",
    ),
    "tensorarena.memory_kind": (
        "MemoryKind",
    ),
    "tensorarena.report": (
        "dump_snapshot", "memory_snapshot", "memory_stats", "memory_summary",
        "record_memory_history", "reset_peak_stats",
    ),
    "tensorarena.sizes": (
        "format_size", "parse_size",
    ),
    "tensorarena.stats": (
        "ArenaStatistics", "Count", "MemoryStatistics",
    ),
    "tensorarena.streams": (
        "CpuStream",
    ),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(["__version__", *_WHERE])


def __getattr__(name: str) -> Any:
    """Import a public name (or a subpackage, ``tensorarena.memory``) on first use."""
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif not name.startswith("__"):
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as missing:
            if missing.name != f"{__name__}.{name}":
                raise  # the submodule exists and failed to import: say why
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
