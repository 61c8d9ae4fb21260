"""Eager PyTorch programs on tensorarena memory, with no graph capture.

:func:`use` routes every allocation torch makes on a device to a tensorarena resource while its
:class:`Route` is installed (a context manager, or an install / uninstall pair);
:func:`memory_stats` reports what went through it in ``torch.cuda.memory_stats()``'s keys.
:func:`learned` is a route to plans learned from a loop's first step (:class:`LearnedSteps`);
:class:`NativePool` is one arena kept in C++, which a route serves with no Python call.
``import tensorarena.torch`` imports no torch: the first :func:`use` does, and builds torch's CPU
allocator shim on first use (:mod:`tensorarena.interop.torch_cpu_shim`).
"""

from tensorarena.torch.learned_steps import LearnedSteps, StepScope, learned
from tensorarena.torch.native_pool import NativePool
from tensorarena.torch.route import Route, Threads, routed_blocks, use
from tensorarena.torch.statistics import RouteStatistics, memory_stats

__all__ = [
    "LearnedSteps",
    "NativePool",
    "Route",
    "RouteStatistics",
    "StepScope",
    "Threads",
    "learned",
    "memory_stats",
    "routed_blocks",
    "use",
]
