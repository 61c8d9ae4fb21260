"""``snapshot()``: the layout of a pool's memory right now — arenas, blocks, where each was made.

A :class:`MemorySnapshot` is plain frozen data: one :class:`SegmentSnapshot` per region held from
below (a pool's arena; for a resource that maps each block on its own, the block) with its
:class:`BlockSnapshot` records in address order, live (``"active_allocated"``) and free
(``"inactive"``), so that the sizes of a segment's blocks add up to the segment. It converts to a
PyTorch memory snapshot (:meth:`MemorySnapshot.to_pytorch`) through the writer of
:mod:`tensorarena.trace` (``build_snapshot``), so PyTorch's viewer shows a pool as it shows its own
caching allocator.

Where it reads. A pool is read through its public surface only: ``pool.arenas`` (base and
capacity of each arena) and ``pool.live_blocks()`` (address → requested bytes). A block's size in
the snapshot is therefore what was *requested*; the bytes a strategy rounded it up by show as a
small free block after it. A resource without arenas (``HostMemory``, ``Arena``,
``VirtualMemory``) gives one segment per live block, or one for an ``Arena``'s whole region.

Sites. A block's allocation stack comes, in this order, from the recorded history
(:func:`~tensorarena.report.history.record_memory_history`) and from any adaptor above the pool
that records stacks (``Tracking``, ``Poisoning``: their addresses are the pool's); it is empty
when none was recorded.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensorarena.adaptors.sites import Stack, as_frames, format_site
from tensorarena.core import Arena
from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.resource import check_resource, resource_stack
from tensorarena.sizes import format_size
from tensorarena.trace import BlockState, SegmentState, SnapshotAction, build_snapshot

__all__ = [
    "ACTIVE",
    "INACTIVE",
    "BlockSnapshot",
    "MemorySnapshot",
    "SegmentSnapshot",
    "find_pool",
    "snapshot",
]

#: PyTorch's names for a block's state.
ACTIVE, INACTIVE = "active_allocated", "inactive"


@dataclass(frozen=True, slots=True)
class BlockSnapshot:
    """One block of a segment: live (``ACTIVE``) or free (``INACTIVE``)."""

    address: int
    size: int
    state: str
    stack: Stack = ()  #: where a live block was allocated (innermost first), if recorded

    @property
    def site(self) -> str:
        """The innermost frame of the allocation site."""
        return format_site(self.stack)


@dataclass(frozen=True, slots=True)
class SegmentSnapshot:
    """One region held from the layer below, its blocks in address order."""

    address: int
    size: int
    blocks: tuple[BlockSnapshot, ...]

    @property
    def active_bytes(self) -> int:
        """Bytes of the live blocks."""
        return sum(block.size for block in self.blocks if block.state == ACTIVE)


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """The segments of a resource (a pool's arenas) and their blocks, at one moment."""

    source: str  #: ``repr`` of the layer read
    segments: tuple[SegmentSnapshot, ...]

    @property
    def reserved_bytes(self) -> int:
        """Bytes of every segment."""
        return sum(segment.size for segment in self.segments)

    @property
    def active_bytes(self) -> int:
        """Bytes of every live block."""
        return sum(segment.active_bytes for segment in self.segments)

    def blocks(self) -> list[BlockSnapshot]:
        """Every live block, in address order."""
        return [b for s in self.segments for b in s.blocks if b.state == ACTIVE]

    def to_pytorch(self, actions: tuple[tuple[SnapshotAction, Stack], ...] = ()) -> dict[str, Any]:
        """A PyTorch memory snapshot dict (``segments`` and ``device_traces``), built by
        :func:`tensorarena.trace.build_snapshot`; ``actions`` (with their stacks) become the
        device trace, which must end in this state. Stacks become the entries' ``frames``."""
        segments = [
            SegmentState(
                address=segment.address,
                total_size=segment.size,
                stream=0,
                small=False,
                blocks=tuple(
                    BlockState(b.address, b.size, b.size if b.state == ACTIVE else 0,
                               b.state == ACTIVE)
                    for b in segment.blocks
                ),
            )
            for segment in self.segments
        ]
        data = build_snapshot([action for action, _ in actions], segments)
        # The writer files a frame for a tag only; the stacks we recorded are richer.
        for entry, (_, stack) in zip(data["device_traces"][0], actions, strict=True):
            if stack:
                entry["frames"] = as_frames(stack)
        for segment_dict, segment in zip(data["segments"], self.segments, strict=True):
            for block_dict, block in zip(segment_dict["blocks"], segment.blocks, strict=True):
                block_dict["frames"] = as_frames(block.stack)
        return data

    def __str__(self) -> str:
        lines = [
            f"{len(self.segments)} segment(s), reserved {format_size(self.reserved_bytes)}, "
            f"active {format_size(self.active_bytes)} — {self.source}"
        ]
        for segment in self.segments:
            live = [b for b in segment.blocks if b.state == ACTIVE]
            lines.append(
                f"  {segment.address:#x} {format_size(segment.size):>10}: {len(live)} live "
                f"block(s), {format_size(segment.active_bytes)}"
            )
        return "\n".join(lines)


# --- reading a resource --------------------------------------------------------------------


def _layers(resource: object) -> list[object]:
    return list(resource_stack(resource))


def _holds_arenas(layer: object) -> bool:
    return callable(getattr(layer, "live_blocks", None)) and hasattr(layer, "arenas")


def find_pool(resource: object) -> object:
    """The layer of ``resource``'s stack whose blocks a snapshot shows: the first pool (it has
    ``arenas`` and ``live_blocks()``), else the first layer with ``live_blocks()``."""
    # A class (``HostMemory`` for ``HostMemory()``) has the methods too: recording it would
    # patch the class for every instance.
    layers = _layers(check_resource(resource, name="resource"))
    for layer in layers:
        if _holds_arenas(layer):
            return layer
    for layer in layers:
        if callable(getattr(layer, "live_blocks", None)):
            return layer
    raise InvalidArgumentError(
        f"{type(resource).__name__} keeps no record of its live blocks (no live_blocks() in "
        "its stack): snapshot a Pool, or a stack with one"
    )


def _site_lookups(resource: object, pool: object) -> list[Callable[[int], Stack | None]]:
    """``stack_of`` of every layer above ``pool`` that records stacks at the pool's addresses
    (a ``Guarded`` hands out addresses inside its upstream blocks, so it cannot name them)."""
    lookups = []
    for layer in _layers(resource):
        if layer is pool:
            break
        method = getattr(layer, "stack_of", None)
        if callable(method) and type(layer).__name__ != "Guarded":
            lookups.append(method)
    return lookups


def snapshot(
    resource: object = None, *, stacks: Mapping[int, Stack] | None = None
) -> MemorySnapshot:
    """The memory layout of ``resource`` (default: the default resource) now.

    ``resource`` may be a pool or any stack with one (the first pool below is read). ``stacks``
    maps addresses to allocation stacks known from elsewhere (a recorded history).
    """
    if resource is None:
        from tensorarena.interop.default import default_resource

        resource = default_resource()
    pool = find_pool(resource)
    lookups = _site_lookups(resource, pool)
    known = dict(stacks or {})

    def stack_of(address: int) -> Stack:
        found = known.get(address)
        if found:
            return found
        for lookup in lookups:
            found = lookup(address)
            if found:
                return found
        return ()

    live: dict[int, int] = pool.live_blocks()  # type: ignore[attr-defined]
    if _holds_arenas(pool):
        regions = [(a.base, a.capacity) for a in pool.arenas]  # type: ignore[attr-defined]
    elif isinstance(pool, Arena):  # one region, carved up
        regions = [(pool.base, pool.capacity)]
    else:  # every block is its own mapping
        regions = [(address, nbytes) for address, nbytes in live.items()]
    regions.sort()
    starts = [base for base, _ in regions]
    per_region: list[list[tuple[int, int]]] = [[] for _ in regions]
    for address, nbytes in sorted(live.items()):
        index = bisect.bisect_right(starts, address) - 1
        if index >= 0:
            per_region[index].append((address, nbytes))
    segments = []
    for (base, size), blocks in zip(regions, per_region, strict=True):
        segments.append(SegmentSnapshot(base, size, _blocks(base, size, blocks, stack_of)))
    return MemorySnapshot(source=repr(pool), segments=tuple(segments))


def _blocks(
    base: int, size: int, live: list[tuple[int, int]], stack_of: Callable[[int], Stack]
) -> tuple[BlockSnapshot, ...]:
    """Live blocks of one region with the free gaps between them, covering it exactly."""
    out: list[BlockSnapshot] = []
    cursor = base
    for address, nbytes in live:
        if address > cursor:
            out.append(BlockSnapshot(cursor, address - cursor, INACTIVE))
        out.append(BlockSnapshot(address, nbytes, ACTIVE, stack_of(address)))
        cursor = address + nbytes
    if cursor < base + size:
        out.append(BlockSnapshot(cursor, base + size - cursor, INACTIVE))
    return tuple(out)
