"""One statistics vocabulary for every layer: PyTorch's words, RMM's counters.

Every quantity that moves is a :class:`Count` — ``current``, ``peak`` and ``total`` (the sum of
every increase since creation; ``freed = total - current``), as RMM's statistics adaptor and
mimalloc's ``mi_stat_count_t`` keep them. The words mean what they mean in
``torch.cuda.memory_stats`` and mean it in every layer:

``requested_bytes``
    the byte counts callers asked for (``nbytes`` of each live block).
``allocated_bytes``
    the bytes live blocks occupy: requests rounded up (to their alignment in an arena or pool,
    to whole pages in an upstream that maps each block).
``active_bytes``
    allocated bytes plus blocks freed by their caller that cannot be reused yet (stream-ordered
    frees waiting for their fence); equal to ``allocated_bytes`` where nothing waits.
``reserved_bytes``
    bytes held from the layer below (a pool's arenas; an upstream's mappings), live or not.
``inactive_split_bytes``
    free bytes inside reserved regions that also hold live blocks: free, but not returnable
    to the layer below (``trim()`` cannot give them back). A gauge: its peak is not tracked.
``allocations`` / ``segments``
    live blocks / regions held from below (arenas, mappings), as counts.

A record is frozen and made by ``statistics()``; :func:`flatten` turns any record into the flat
dictionary of ``torch.cuda.memory_stats()`` (``"allocated_bytes.all.current"``, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["ArenaStatistics", "Count", "MemoryStatistics", "flatten"]


@dataclass(frozen=True, slots=True)
class Count:
    """One quantity: its value now, its highest value, and the sum of every increase."""

    current: int = 0
    peak: int = 0
    total: int = 0

    @property
    def freed(self) -> int:
        """The sum of every decrease: ``total - current``."""
        return self.total - self.current


@dataclass(frozen=True, slots=True)
class MemoryStatistics:
    """A snapshot of anything that holds memory: an arena, a pool, an upstream resource.

    Sizes in bytes. ``limit`` is the cap on ``reserved_bytes`` (``None``: none).
    """

    requested_bytes: Count
    allocated_bytes: Count
    active_bytes: Count
    reserved_bytes: Count
    allocations: Count  #: live blocks
    segments: Count  #: regions held from the layer below
    inactive_split_bytes: int = 0
    free_bytes: int = 0  #: free bytes inside the reserved regions
    largest_free_bytes: int = 0  #: the largest request that could be served without growing
    free_extents: int = 0  #: separate free extents inside the reserved regions
    num_alloc_retries: int = 0  #: requests served only after giving memory back and retrying
    num_ooms: int = 0  #: requests refused with OutOfMemoryError
    num_upstream_allocs: int = 0  #: successful calls to the layer below to get memory
    num_upstream_frees: int = 0  #: successful calls to the layer below to give memory back
    limit: int | None = None

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free``: 0 when the free space is one extent (or there is none)."""
        if not self.free_bytes:
            return 0.0
        return 1.0 - self.largest_free_bytes / self.free_bytes


@dataclass(frozen=True, slots=True)
class ArenaStatistics:
    """A snapshot of one :class:`~tensorarena.core.Arena`: bookkeeping over one region.

    The same words as :class:`MemoryStatistics`. An arena holds its whole region (``capacity``)
    from creation; ``allocated_bytes`` is a gauge here, the bytes its strategy holds for live
    blocks now (requests rounded to their alignment and to the strategy's own block sizes):
    counting its peak and total would cost every call a measurable share, and a pool above counts
    its own.
    """

    capacity: int
    requested_bytes: Count
    allocated_bytes: int
    allocations: Count  #: live blocks
    inactive_split_bytes: int = 0
    free_bytes: int = 0
    largest_free_bytes: int = 0
    free_extents: int = 0
    num_ooms: int = 0

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free``: 0 when the free space is one extent (or there is none)."""
        if not self.free_bytes:
            return 0.0
        return 1.0 - self.largest_free_bytes / self.free_bytes


#: Field names whose flat keys are PyTorch's singular ones.
_FLAT_NAMES = {"allocations": "allocation", "segments": "segment"}


def flatten(record: object, *, prefix: str = "") -> dict[str, int | float | None]:
    """A statistics record as ``torch.cuda.memory_stats()``'s flat dictionary.

    A :class:`Count` field ``name`` gives ``name.all.current``, ``.peak``, ``.allocated`` (the
    total) and ``.freed``; any other number keeps its name. ``prefix`` is prepended to every key
    (``"thread_cache."``, say, for an adaptor's own record).
    """
    if not dataclasses.is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"not a statistics record: {type(record).__name__}")
    flat: dict[str, int | float | None] = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        name = prefix + _FLAT_NAMES.get(field.name, field.name)
        if isinstance(value, Count):
            flat[f"{name}.all.current"] = value.current
            flat[f"{name}.all.peak"] = value.peak
            flat[f"{name}.all.allocated"] = value.total
            flat[f"{name}.all.freed"] = value.freed
        elif value is None or isinstance(value, int | float):
            flat[name] = value
    return flat
