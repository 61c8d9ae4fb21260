"""Eager PyTorch programs on tensorarena memory, with no graph capture.

:func:`use` routes every allocation torch makes on a device to a tensorarena resource while its
:class:`Route` is installed (a context manager, or an install / uninstall pair);
:func:`memory_stats` reports what went through it in ``torch.cuda.memory_stats()``'s keys.
``import tensorarena.torch`` imports no torch: the first :func:`use` does, and builds torch's CPU
allocator shim on first use (:mod:`tensorarena.interop.torch_cpu_shim`).
"""

from tensorarena.torch.route import Route, Threads, routed_blocks, use
from tensorarena.torch.statistics import RouteStatistics, memory_stats

__all__ = ["Route", "RouteStatistics", "Threads", "memory_stats", "routed_blocks", "use"]
