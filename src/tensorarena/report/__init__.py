"""Reports on memory: PyTorch's ``memory_summary``/``memory_stats``/``reset_peak_stats``, its
memory history and snapshots (``record_memory_history``, ``memory_snapshot``, ``dump_snapshot``),
a pool's layout (``snapshot``) and the memory timeline behind ``tensorarena viz``
(``load_timeline``; the pictures are in :mod:`tensorarena.report.viz`)."""

from tensorarena.report.history import (
    MemoryHistory,
    dump_snapshot,
    memory_history,
    memory_snapshot,
    record_memory_history,
)
from tensorarena.report.snapshot import (
    BlockSnapshot,
    MemorySnapshot,
    SegmentSnapshot,
    snapshot,
)
from tensorarena.report.summary import (
    memory_stats,
    memory_summary,
    reset_peak_stats,
    resource_stack,
)
from tensorarena.report.timeline import (
    Timeline,
    load_timeline,
    timeline_from_events,
    timeline_from_snapshot,
)

__all__ = [
    "BlockSnapshot",
    "MemoryHistory",
    "MemorySnapshot",
    "SegmentSnapshot",
    "Timeline",
    "dump_snapshot",
    "load_timeline",
    "memory_history",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "record_memory_history",
    "reset_peak_stats",
    "resource_stack",
    "snapshot",
    "timeline_from_events",
    "timeline_from_snapshot",
]
