"""Reports on memory: PyTorch's ``memory_summary``/``memory_stats``/``reset_peak_stats``."""

from tensorarena.report.summary import (
    memory_stats,
    memory_summary,
    reset_peak_stats,
    resource_stack,
)

__all__ = ["memory_stats", "memory_summary", "reset_peak_stats", "resource_stack"]
