"""A memory timeline: live and reserved bytes after every action, and every block's place in time
and in memory — the data behind ``tensorarena viz``, made from a trace or a snapshot.

Two sources, one result (:class:`Timeline`, NumPy arrays):

* a PyTorch memory snapshot (ours from :func:`~tensorarena.report.dump_snapshot`, or PyTorch's
  own), whose device trace has real addresses: ``alloc`` opens a block, ``free_completed`` (or
  ``free``) closes it, ``segment_alloc``/``segment_free`` move the reserved bytes. Blocks that
  were live before the history starts (freed in it without an ``alloc``, or active in the final
  ``segments``) are drawn from the start, as PyTorch's viewer draws them. Loaded through the
  trace package's restricted unpickler: a snapshot file cannot run code;
* an allocation trace in any format :mod:`tensorarena.trace` reads (ids and sizes, no
  addresses), replayed on a :class:`~tensorarena.memory.Pool` of the chosen strategy over
  :class:`~tensorarena.memory.VirtualMemory`: the addresses and arenas are that pool's, so the
  picture shows how *our* allocator would lay the workload out. The file is streamed: memory
  grows with the number of allocations, never with a text of the whole trace.

Time is ``time_us`` where every action has one, else the action's index. A block's ``site`` (what
it is grouped and labelled by) is the first frame of its Python stack outside the libraries, else
its tag (:mod:`tensorarena.report.site_labels`); its whole stack stays with it
(``block_stack``), for a page to show on hover, and so does the allocator that served it
(``block_allocator``: a trace recorded from torch and tensorarena together names both).

Memory ``y``: addresses are mapped onto the concatenation of the regions that were ever held
(segments, or the blocks themselves where a snapshot names no segments), so arenas that lie far
apart in the address space sit next to each other in the picture (:meth:`Timeline.offsets`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryKind, Stream
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.report.site_labels import site_label
from tensorarena.trace import (
    ALLOC,
    FREE,
    SITE_SEPARATOR,
    Event,
    MalformedTraceError,
    detect_format,
    iter_events,
)
from tensorarena.trace.model import check_events
from tensorarena.trace.plain_pickle import load_plain

__all__ = ["Timeline", "load_timeline", "timeline_from_events", "timeline_from_snapshot"]

_FREES = ("free_completed", "free")
_NO_SITE = "<no site recorded>"


@dataclass(frozen=True, eq=False)
class Timeline:
    """Live/reserved bytes per action and every block's extent in time and memory.

    Per action (``steps``): ``time``, ``live``, ``reserved`` (``None`` when the source says
    nothing of reserved memory). Per block: ``block_start``/``block_end`` (times; ``end`` is
    ``nan`` for a block live at the end), ``block_address``, ``block_size``, ``block_site``
    (index into ``sites``). ``regions``: sorted, disjoint ``(start, end)`` address ranges that
    were ever held, the memory axis.
    """

    name: str
    time_unit: str  #: ``"us"`` or ``"action"``
    time: np.ndarray
    live: np.ndarray
    reserved: np.ndarray | None
    block_start: np.ndarray
    block_end: np.ndarray
    block_address: np.ndarray
    block_size: np.ndarray
    block_site: np.ndarray
    sites: tuple[str, ...]
    regions: np.ndarray
    source: str  #: where the addresses come from: "snapshot" or "replayed on Pool(...)"
    block_allocator: np.ndarray | None = None  #: index into ``allocators`` per block
    allocators: tuple[str, ...] = ("",)  #: ``""``: the source names none
    block_stack: np.ndarray | None = None  #: index into ``stacks`` per block
    stacks: tuple[str, ...] = ("",)  #: each distinct Python stack, ``""`` for none

    @property
    def steps(self) -> int:
        """Allocations and frees (the points of the curves)."""
        return int(self.time.size)

    @property
    def blocks(self) -> int:
        """Allocations drawn (pre-existing ones included)."""
        return int(self.block_size.size)

    @property
    def end_time(self) -> float:
        """The last time (where blocks live at the end are drawn to)."""
        return float(self.time[-1]) if self.time.size else 0.0

    @property
    def peak_index(self) -> int:
        """The step at which the live bytes peak (the first such)."""
        return int(np.argmax(self.live)) if self.live.size else 0

    def offsets(self, addresses: np.ndarray) -> np.ndarray:
        """Positions of ``addresses`` on the memory axis: bytes from the start of the first
        region, the regions laid end to end."""
        starts = self.regions[:, 0]
        lengths = self.regions[:, 1] - starts
        before = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        index = np.clip(np.searchsorted(starts, addresses, side="right") - 1, 0, None)
        positions: np.ndarray = before[index] + (addresses - starts[index])
        return positions

    @property
    def span(self) -> int:
        """Bytes on the memory axis (all regions together)."""
        return int((self.regions[:, 1] - self.regions[:, 0]).sum())

    def live_at(self, index: int) -> np.ndarray:
        """A mask of the blocks live just after step ``index`` (negative: from the end)."""
        if isinstance(index, bool) or not isinstance(index, int | np.integer) or not (
                -self.steps <= index < self.steps):
            raise InvalidArgumentError(
                f"step index must be an int in [{-self.steps}, {self.steps}), not {index!r}"
            )
        when = self.time[index]
        end = np.where(np.isnan(self.block_end), np.inf, self.block_end)
        mask: np.ndarray = (self.block_start <= when) & (end > when)
        return mask


def _merge(ranges: np.ndarray) -> np.ndarray:
    """Sorted disjoint union of ``(start, end)`` rows."""
    if not ranges.size:
        return np.zeros((1, 2), dtype=np.int64) + np.array([0, 1], dtype=np.int64)
    ranges = ranges[np.argsort(ranges[:, 0], kind="stable")]
    merged: list[list[int]] = []
    for start, end in ranges.tolist():
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return np.array(merged, dtype=np.int64)


class _Builder:
    """Accumulates steps and blocks as plain lists, then makes the arrays once. A block's
    start and end are step numbers until :meth:`finish` turns them into times."""

    def __init__(self) -> None:
        self.stamps: list[float] = []  # per step: its time (time_us, or nan when unknown)
        self.live: list[int] = []
        self.reserved: list[int] = []
        self.start: list[int] = []
        self.end: list[int] = []  # -1: live at the end
        self.address: list[int] = []
        self.size: list[int] = []
        self.site: list[int] = []
        self.site_index: dict[str, int] = {}
        self.allocator: list[int] = []
        self.allocator_index: dict[str, int] = {"": 0}
        self.stack: list[int] = []
        self.stack_index: dict[str, int] = {"": 0}
        self.label_of: dict[tuple[str, str], int] = {}  # (stack, tag) -> site index
        self.regions: list[tuple[int, int]] = []

    def site_of(self, name: str) -> int:
        index = self.site_index.get(name)
        if index is None:
            index = self.site_index[name] = len(self.site_index)
        return index

    def open(self, step: int, address: int, nbytes: int, tag: str, stack: str = "",
             allocator: str = "") -> int:
        """A block from ``step``, labelled by its stack's first frame outside the libraries
        (else its tag): computed once per distinct (stack, tag)."""
        key = (stack, tag)
        site = self.label_of.get(key)
        if site is None:
            site = self.label_of[key] = self.site_of(site_label(stack, tag))
        self.start.append(step)
        self.end.append(-1)
        self.address.append(address)
        self.size.append(nbytes)
        self.site.append(site)
        self.stack.append(self.stack_index.setdefault(stack, len(self.stack_index)))
        self.allocator.append(self.allocator_index.setdefault(allocator,
                                                              len(self.allocator_index)))
        return len(self.start) - 1

    def finish(self, name: str, source: str, *, reserved: bool,
               regions_from_blocks: bool) -> Timeline:
        stamps = np.array(self.stamps, dtype=np.float64)
        timed = bool(stamps.size) and not np.isnan(stamps).any()
        time = stamps if timed else np.arange(stamps.size, dtype=np.float64)
        start = np.array(self.start, dtype=np.int64)
        end = np.array(self.end, dtype=np.int64)
        last = max(time.size - 1, 0)
        padded = time if time.size else np.zeros(1)
        block_start = padded[np.clip(start, 0, last)]
        block_end = np.where(end >= 0, padded[np.clip(end, 0, last)], np.nan)
        address = np.array(self.address, dtype=np.int64)
        size = np.array(self.size, dtype=np.int64)
        if regions_from_blocks or not self.regions:
            ranges = np.stack([address, address + size], axis=1) if address.size else \
                np.zeros((0, 2), dtype=np.int64)
        else:
            ranges = np.array(self.regions, dtype=np.int64)
        return Timeline(
            name=name,
            time_unit="us" if timed else "action",
            time=time,
            live=np.array(self.live, dtype=np.int64),
            reserved=np.array(self.reserved, dtype=np.int64) if reserved else None,
            block_start=block_start,
            block_end=block_end,
            block_address=address,
            block_size=size,
            block_site=np.array(self.site, dtype=np.int32),
            sites=tuple(self.site_index),
            regions=_merge(ranges),
            source=source,
            block_allocator=np.array(self.allocator, dtype=np.int32),
            allocators=tuple(self.allocator_index),
            block_stack=np.array(self.stack, dtype=np.int32),
            stacks=tuple(self.stack_index),
        )


# --- from a snapshot -------------------------------------------------------------------------


def _frame_site(frames: object) -> tuple[str, str]:
    """(the Python stack as a site, the ``<tag>`` frame's name) of a snapshot's frames."""
    if not isinstance(frames, list):
        return "", ""
    tag, stack = "", []
    for frame in frames[:64]:
        if not isinstance(frame, dict):
            continue
        if frame.get("filename") == "<tag>":
            tag = tag or str(frame.get("name", ""))
        else:
            stack.append(f"{frame.get('filename', '?')}:{frame.get('line', '?')} in "
                         f"{frame.get('name', '?')}")
    return SITE_SEPARATOR.join(stack), tag


def timeline_from_snapshot(data: object, *, device: int | None = None,
                           name: str = "snapshot") -> Timeline:
    """The timeline of a PyTorch memory snapshot dict (one device's trace)."""
    if not isinstance(data, dict) or not isinstance(data.get("device_traces"), list):
        raise MalformedTraceError("not a PyTorch memory snapshot: expected a dict with "
                                  "'device_traces'")
    traces = data["device_traces"]
    used = [i for i, trace in enumerate(traces) if trace]
    if device is None:
        device = used[0] if used else 0
    if not 0 <= device < max(len(traces), 1):
        raise InvalidArgumentError(f"the snapshot has no device {device}")
    entries: list[Any] = traces[device] if traces else []
    actions = [e for e in entries if isinstance(e, dict) and e.get("action") in
               ("alloc", *_FREES, "segment_alloc", "segment_free")]
    steps = [e for e in actions if e["action"] == "alloc" or e["action"] in _FREES]
    builder = _Builder()
    segments = [s for s in data.get("segments") or [] if isinstance(s, dict)
                and s.get("device", device) == device]
    # Reserved at the end, then walked back: what was live before the history started.
    reserved_end = sum(int(s.get("total_size", 0)) for s in segments)
    for s in segments:
        builder.regions.append((int(s["address"]), int(s["address"]) + int(s["total_size"])))
    for e in actions:
        if e["action"].startswith("segment"):
            builder.regions.append((int(e["addr"]), int(e["addr"]) + int(e["size"])))
    delta = sum(int(e["size"]) * (1 if e["action"] == "segment_alloc" else -1)
                for e in actions if e["action"].startswith("segment"))
    reserved = reserved_end - delta
    has_reserved = bool(segments) or delta != 0
    # Blocks live from before the history: freed without an alloc, or active at the end.
    # Only an address's *first* action can be a free of an earlier block; a later free of a
    # block not live is an error, found below.
    opened: set[int] = set()
    seen: set[int] = set()
    pending: dict[int, int] = {}  # address -> nbytes freed without an alloc seen
    for e in steps:
        address = int(e["addr"])
        if e["action"] == "alloc":
            opened.add(address)
        elif address not in seen:
            pending[address] = int(e["size"])
        else:
            opened.discard(address)
        seen.add(address)
    early: list[tuple[int, int, tuple[str, str]]] = [(a, n, ("", _NO_SITE))
                                                     for a, n in pending.items()]
    live_at_end = set(opened)
    for s in segments:
        for block in s.get("blocks") or []:
            address = int(block.get("address", 0))
            if block.get("state") == "active_allocated" and address not in live_at_end:
                early.append((address, int(block.get("requested_size") or block["size"]),
                              _frame_site(block.get("frames"))))
    live = 0
    blocks: dict[int, int] = {}
    for address, nbytes, (stack, tag) in early:
        blocks[address] = builder.open(0, address, nbytes, tag, stack)
        live += nbytes
    for index, e in enumerate(actions):
        kind = e["action"]
        if kind == "segment_alloc":
            reserved += int(e["size"])
            continue
        if kind == "segment_free":
            reserved -= int(e["size"])
            continue
        step = len(builder.stamps)
        stamp = e.get("time_us")
        address, nbytes = int(e["addr"]), int(e["size"])
        if kind == "alloc":
            stack, tag = _frame_site(e.get("frames"))
            blocks[address] = builder.open(step, address, nbytes, tag, stack)
            live += nbytes
        else:
            block = blocks.pop(address, None)
            if block is None:
                raise MalformedTraceError(f"device_traces[{device}][{index}]: free of "
                                          f"{address:#x}, which is not live", line=index + 1)
            builder.end[block] = step
            live -= builder.size[block]
        builder.stamps.append(float(stamp) if type(stamp) is int else np.nan)
        builder.live.append(live)
        builder.reserved.append(max(reserved, live) if has_reserved else 0)
    return builder.finish(name, "snapshot", reserved=has_reserved,
                          regions_from_blocks=not builder.regions)


# --- from a trace ----------------------------------------------------------------------------


class _Reserving:
    """An upstream that counts the bytes a pool holds from it and remembers every region."""

    memory_kind = MemoryKind.ADDRESS_SPACE

    def __init__(self) -> None:
        self.upstream = VirtualMemory()
        self.reserved = 0
        self.regions: list[tuple[int, int]] = []

    def allocate(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT,
                 stream: Stream = None) -> int:
        address = self.upstream.allocate(nbytes, alignment, stream)
        self.reserved += nbytes
        self.regions.append((address, address + nbytes))
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        self.upstream.deallocate(address, nbytes, stream)
        self.reserved -= nbytes


def timeline_from_events(events: Iterable[Event], *, strategy: str = "best_fit",
                         name: str = "trace") -> Timeline:
    """The timeline of checked trace events, replayed on ``Pool(VirtualMemory(), strategy)``
    for addresses and reserved bytes."""
    events = check_events(events)
    below = _Reserving()
    pool = Pool(below, strategy=strategy, initial_size=0, thread_safe=False)
    allocate, deallocate = pool.allocate, pool.deallocate
    builder = _Builder()
    blocks: dict[int, int] = {}  # id -> block index
    open_block, addresses, sizes, ends = builder.open, builder.address, builder.size, builder.end
    stamps, live_list, reserved_list = builder.stamps, builder.live, builder.reserved
    nan = float("nan")
    live = 0
    for step, event in enumerate(events):
        op, ident, nbytes, _, time_us, tag, allocator, site = event
        if op == ALLOC:
            blocks[ident] = open_block(step, allocate(nbytes), nbytes, tag or "<no tag>", site,
                                       allocator)
            live += nbytes
        elif op == FREE:
            index = blocks.pop(ident, -1)
            if index < 0:
                raise MalformedTraceError(f"free of id {ident}, which is not live",
                                          line=step + 1)
            deallocate(addresses[index], sizes[index])
            ends[index] = step
            live -= sizes[index]
        stamps.append(nan if time_us is None else float(time_us))
        live_list.append(live)
        reserved_list.append(below.reserved)
    builder.regions = below.regions
    return builder.finish(name, f"replayed on Pool(VirtualMemory(), strategy={strategy!r})",
                          reserved=True, regions_from_blocks=False)


def load_timeline(path: str | os.PathLike[str], *, strategy: str = "best_fit",
                  device: int | None = None) -> Timeline:
    """The timeline of a file: a snapshot pickle (its own addresses) or a trace in any format
    (replayed on a pool of ``strategy``), told apart by content."""
    name = Path(path).name
    if detect_format(path) == "pytorch_snapshot":
        try:
            with open(path, "rb") as handle:
                data = load_plain(handle, name=str(path))
        except OSError as exc:
            raise MalformedTraceError(f"cannot read {str(path)!r}: {exc.strerror or exc}"
                                      ) from exc
        return timeline_from_snapshot(data, device=device, name=name)
    return timeline_from_events(iter_events(path), strategy=strategy, name=name)
