"""PyTorch memory snapshots, both ways: the pickle of ``torch.cuda.memory._dump_snapshot``.

A snapshot is a dict: ``segments`` (each ``cudaMalloc``'d segment with its ``blocks``, active or
inactive, at the moment of the dump) and ``device_traces`` (per device, the allocator's recent
actions — ``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
``oom``, ... — each with ``addr``, ``size``, ``stream``, ``time_us`` and ``frames``).

Reading (:func:`read_snapshot`) goes through the restricted unpickler of
:mod:`tensorarena.trace.plain_pickle` (a crafted file cannot run code) and keeps the workload:
each ``alloc`` opens an allocation, each ``free_completed`` (the moment its bytes could be reused;
``free`` in older files) closes the one at that address; ``free_requested`` marks only the
caller's intent and is skipped. The allocator's own decisions (``segment_*``), ``oom`` and
actions we do not know are counted in the trace's metadata. PyTorch keeps a bounded history, so
a block freed in the window but allocated before it, or still active in ``segments`` and never
allocated in the window, was live when the history starts: both become allocations at the start
of the trace (``metadata["preexisting"]`` counts them), as PyTorch's own viewer draws them.

Writing (:func:`write_snapshot`, :func:`snapshot_of`, :func:`build_snapshot`) makes a file that
PyTorch's tools open — ``torch.cuda._memory_viz`` (``trace_plot``, ``segment_plot``, ``segsum``,
``trace``) and the page pytorch.org/memory_viz. A trace has no addresses of its own, so
:func:`snapshot_of` replays it on :class:`~tensorarena.trace.PyTorchLike` and records its
actions: the viewer then shows the trace as PyTorch's allocator would have placed it. A live
:class:`~tensorarena.memory.Pool` gives its arenas and blocks as they are
(:func:`pool_segments`), with the history of Logging adaptors around it and its upstream if
there are any (:func:`actions_from_log`); anything else that knows its actions and segments
builds a snapshot with :func:`build_snapshot` directly. Files are pickled with protocol 4: the
viewer's JavaScript unpickler reads protocols 2 to 4 only.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tensorarena.adaptors.logging import LogRecord
from tensorarena.memory.pool import Pool
from tensorarena.trace._text import is_path
from tensorarena.trace.atomic import atomic_binary
from tensorarena.trace.model import (
    ALLOC,
    FREE,
    SITE_SEPARATOR,
    Event,
    MalformedTraceError,
    Trace,
    check_events,
)
from tensorarena.trace.plain_pickle import load_plain
from tensorarena.trace.pytorch_like import BlockState, PyTorchLike, SegmentState

__all__ = [
    "SNAPSHOT_PROTOCOL",
    "SnapshotAction",
    "actions_from_log",
    "build_snapshot",
    "pool_segments",
    "read_snapshot",
    "snapshot_events",
    "snapshot_of",
    "write_snapshot",
]

#: The pickle protocol written: the memory_viz page's unpickler reads protocols 2-4 only.
SNAPSHOT_PROTOCOL = 4
#: The file name of a frame that carries an event's tag (shown as ``<tag>:0:NAME``).
TAG_FILENAME = "<tag>"
_FREES = ("free_completed", "free")
_SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


@dataclass(frozen=True, slots=True)
class SnapshotAction:
    """One entry of a device trace. ``action`` is one of PyTorch's (``alloc``,
    ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``) or
    ``free``, which :func:`build_snapshot` writes as ``free_requested`` + ``free_completed``
    (what PyTorch records for a free that is reusable at once). For ``oom``, ``address`` is
    unused and ``nbytes`` is the refused request."""

    action: str
    address: int
    nbytes: int
    stream: int = 0
    time_us: int | None = None
    tag: str = ""
    site: str = ""  #: an event's Python stack, ``file.py:12 in f; ...`` (innermost first)


def _frames(tag: str, site: str = "") -> list[dict[str, Any]]:
    """The tag as a ``<tag>`` frame, then the site's frames as PyTorch's viewer shows them."""
    frames = [{"filename": TAG_FILENAME, "line": 0, "name": tag}] if tag else []
    for text in site.split(SITE_SEPARATOR) if site else ():
        place, _, name = text.rpartition(" in ")
        filename, _, line = place.rpartition(":")
        frames.append({"filename": filename or place, "line": int(line) if line.isdecimal()
                       and line.isascii() else 0, "name": name})
    return frames


def _site(entry: Mapping[str, Any], known: dict[str, str]) -> str:
    """The Python frames of an entry (all but a ``<tag>`` one) as an event's ``site``."""
    frames = entry.get("frames")
    if not isinstance(frames, list):
        return ""
    text = SITE_SEPARATOR.join(
        f"{f.get('filename', '?')}:{f.get('line', 0)} in {f.get('name', '?')}"
        for f in frames[:64] if isinstance(f, dict) and f.get("filename") != TAG_FILENAME)
    return known.setdefault(text, text)


def _entry(action: str, item: SnapshotAction) -> dict[str, Any]:
    entry: dict[str, Any] = {"action": action, "addr": item.address, "size": item.nbytes,
                             "stream": item.stream, "frames": _frames(item.tag, item.site)}
    if action == "oom":
        entry = {"action": "oom", "size": item.nbytes, "stream": item.stream,
                 "device_free": 0, "frames": entry["frames"]}
    if item.time_us is not None:
        entry["time_us"] = item.time_us
    return entry


def build_snapshot(actions: Iterable[SnapshotAction], segments: Iterable[SegmentState], *,
                   device: int = 0) -> dict[str, Any]:
    """The snapshot dict of ``actions`` (in order) ending in the state ``segments``.

    ``segments`` must be the allocator's state *after* the last action, with every block of
    each segment (active and free) so that their sizes add up to the segment's: the viewer
    replays the actions backwards from that state. ``device`` is the index the trace is filed
    under (the others are empty lists). The result pickles with plain types only.
    """
    if type(device) is not int or device < 0:
        raise MalformedTraceError(f"device must be a non-negative int, got {device!r}")
    trace: list[dict[str, Any]] = []
    for item in actions:
        if item.action == "free":
            trace.append(_entry("free_requested", item))
            trace.append(_entry("free_completed", item))
        else:
            trace.append(_entry(item.action, item))
    segment_dicts = []
    for segment in segments:
        blocks: list[dict[str, Any]] = [{"address": b.address, "size": b.size,
                   "requested_size": b.requested if b.allocated else 0,
                   "state": "active_allocated" if b.allocated else "inactive", "frames": []}
                  for b in segment.blocks]
        active = sum(b.size for b in segment.blocks if b.allocated)
        segment_dicts.append({
            "device": device, "address": segment.address, "total_size": segment.total_size,
            "allocated_size": active, "active_size": active,
            "requested_size": sum(b.requested for b in segment.blocks if b.allocated),
            "stream": segment.stream, "segment_type": "small" if segment.small else "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
        })
    return {"segments": segment_dicts,
            "device_traces": [[] for _ in range(device)] + [trace]}


def pool_segments(pool: Pool) -> tuple[SegmentState, ...]:
    """A :class:`~tensorarena.memory.Pool`'s state as snapshot segments: each arena a segment,
    each live block an active block (its size the request rounded up to 256 bytes, within the
    room before the next block), the gaps between them inactive."""
    live = sorted(pool.live_blocks().items())
    segments = []
    index = 0
    for arena in sorted(pool.arenas, key=lambda a: a.base):
        end = arena.base + arena.capacity
        cursor = arena.base
        blocks: list[BlockState] = []
        while index < len(live) and live[index][0] < end:
            address, requested = live[index]
            index += 1
            following = live[index][0] if index < len(live) and live[index][0] < end else end
            if address > cursor:
                blocks.append(BlockState(cursor, address - cursor, 0, False))
            size = min(-(-requested // 256) * 256, following - address)
            blocks.append(BlockState(address, size, requested, True))
            cursor = address + size
        if cursor < end:
            blocks.append(BlockState(cursor, end - cursor, 0, False))
        segments.append(SegmentState(arena.base, arena.capacity, 0, False, tuple(blocks)))
    return tuple(segments)


def actions_from_log(records: Iterable[LogRecord], *, segments: bool = False
                     ) -> list[SnapshotAction]:
    """Snapshot actions from a :class:`~tensorarena.adaptors.Logging` adaptor's records:
    ``alloc``/``free`` (or, with ``segments=True``, for a log of a pool's upstream,
    ``segment_alloc``/``segment_free``), and ``oom`` for refused allocations. Times become
    microseconds of ``time.perf_counter_ns``; merge two logs by sorting on ``time_us``."""
    names = {"allocate": "segment_alloc" if segments else "alloc",
             "free": "segment_free" if segments else "free", "allocate_failure": "oom"}
    return [SnapshotAction(names[r.action], r.address, r.nbytes,
                           r.stream if type(r.stream) is int else 0, r.time_ns // 1000)
            for r in records if r.action in names]


def snapshot_of(source: Iterable[Event] | Pool, *, device: int = 0,
                history: Iterable[SnapshotAction] = ()) -> dict[str, Any]:
    """A snapshot dict of a trace, or of a live pool.

    A trace (a :class:`~tensorarena.trace.Trace` or checked events) is replayed on
    :class:`PyTorchLike`, so the snapshot shows it as PyTorch's caching allocator would have
    served it. A :class:`~tensorarena.memory.Pool` gives its current arenas and blocks
    (:func:`pool_segments`) and, as its history, the ``history`` actions if any (built with
    :func:`actions_from_log` from Logging adaptors around the pool and its upstream).
    """
    if isinstance(source, Pool):
        return build_snapshot(sorted(history, key=lambda a: a.time_us or 0),
                              pool_segments(source), device=device)
    actions: list[SnapshotAction] = []
    current: list[Event] = []

    def record(action: str, address: int, nbytes: int, stream: int) -> None:
        event = current[0]
        actions.append(SnapshotAction(action, address, nbytes, stream, event.time_us,
                                      event.tag, event.site if action == "alloc" else ""))

    allocator = PyTorchLike(on_action=record)
    addresses: dict[int, int] = {}
    for event in check_events(source):
        current[:] = [event]
        op, ident, nbytes, stream = event[0], event[1], event[2], event[3]
        if op == ALLOC:
            addresses[ident] = allocator.allocate(nbytes, stream=stream)
        elif op == FREE:
            allocator.deallocate(addresses.pop(ident), nbytes, stream=stream)
        else:
            raise MalformedTraceError(f"unknown op {op!r} in {event!r}")
    return build_snapshot(actions, allocator.segments(), device=device)


def write_snapshot(source: Iterable[Event] | Pool | Mapping[str, Any],
                   path: str | os.PathLike[str], *, device: int = 0) -> None:
    """Write a PyTorch memory snapshot pickle to ``path``, atomically.

    ``source`` is a trace (or checked events) or a live pool, made into a snapshot by
    :func:`snapshot_of`, or a snapshot dict already built (:func:`build_snapshot`). Open the file
    at pytorch.org/memory_viz, or with ``python -m torch.cuda._memory_viz trace_plot FILE``.
    """
    snapshot = dict(source) if isinstance(source, Mapping) else snapshot_of(source,
                                                                            device=device)
    with atomic_binary(path) as handle:
        pickle.dump(snapshot, handle, protocol=SNAPSHOT_PROTOCOL)


# --- reading -------------------------------------------------------------------------------


def _field(entry: Mapping[str, Any], key: str, where: str, line: int) -> int:
    value = entry.get(key)
    if type(value) is not int:
        raise MalformedTraceError(f"{where}: {key!r} must be an int, got {value!r:.40}",
                                  line=line, column=key)
    return value


def _tag(entry: Mapping[str, Any]) -> str:
    frames = entry.get("frames")
    if isinstance(frames, list) and frames and isinstance(frames[0], dict) \
            and frames[0].get("filename") == TAG_FILENAME:
        return str(frames[0].get("name", ""))
    category = entry.get("category")
    return category if isinstance(category, str) else ""


def _pick_device(traces: list[Any], device: int | None) -> int:
    used = [i for i, trace in enumerate(traces) if trace]
    if device is not None:
        if not 0 <= device < len(traces):
            raise MalformedTraceError(f"the snapshot has no device {device} (it has "
                                      f"{len(traces)} device traces)")
        return device
    if not used:
        raise MalformedTraceError(
            "the snapshot has no allocation history: record one with "
            "torch.cuda.memory._record_memory_history() before _dump_snapshot()")
    if len(used) > 1:
        raise MalformedTraceError(f"the snapshot has histories for devices {used}: choose one "
                                  "with device=")
    return used[0]


def snapshot_events(snapshot: object, *, device: int | None = None
                    ) -> tuple[list[Event], dict[str, str]]:
    """The events of one device of a snapshot dict, and what reading it counted.

    ``line`` in errors is the 1-based index of the entry in ``device_traces[device]``.
    """
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        kind = "a list of segments (a snapshot without history)" if isinstance(
            snapshot, list) else type(snapshot).__name__
        raise MalformedTraceError(f"not a PyTorch memory snapshot: expected a dict with "
                                  f"'device_traces', got {kind}")
    traces = snapshot["device_traces"]
    device = _pick_device(traces, device)
    entries = traces[device]
    if not isinstance(entries, list):
        raise MalformedTraceError(f"device_traces[{device}] is not a list")
    counts = {"preexisting": 0, "free_requested": 0, "segment_actions": 0, "ooms": 0,
              "ignored_actions": 0}
    ids: dict[int, tuple[int, int]] = {}  # live address -> (id, nbytes)
    events: list[Event] = []
    early: list[Event] = []
    next_id = 0
    sites: dict[str, str] = {}  # one string per distinct stack
    start = None
    for line, entry in enumerate(entries, 1):
        where = f"device_traces[{device}][{line - 1}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("action"), str):
            raise MalformedTraceError(f"{where}: expected a dict with an 'action'", line=line)
        action = entry["action"]
        stamp = entry.get("time_us")
        time_us = stamp if type(stamp) is int else None
        start = time_us if start is None else start
        if action == "alloc" or action in _FREES:
            address = _field(entry, "addr", where, line)
            nbytes = _field(entry, "size", where, line)
            stream = entry.get("stream", 0)
            stream = stream if type(stream) is int else 0
            if action == "alloc":
                if address in ids:
                    raise MalformedTraceError(f"{where}: alloc at {address:#x}, which is already "
                                              "live", line=line, column="addr")
                ids[address] = (next_id, nbytes)
                events.append(Event(ALLOC, next_id, nbytes, stream, time_us, _tag(entry), "",
                                    _site(entry, sites)))
                next_id += 1
                continue
            known = ids.pop(address, None)
            if known is None:  # allocated before the history starts
                known = (next_id, nbytes)
                next_id += 1
                early.append(Event(ALLOC, known[0], nbytes, stream, None, _tag(entry)))
            events.append(Event(FREE, known[0], nbytes, stream, time_us, _tag(entry)))
        elif action == "free_requested":
            counts["free_requested"] += 1
        elif action in _SEGMENT_ACTIONS:
            counts["segment_actions"] += 1
        elif action == "oom":
            counts["ooms"] += 1
        else:
            counts["ignored_actions"] += 1
    live = set(ids)
    for segment in snapshot.get("segments") or []:
        if not isinstance(segment, dict) or segment.get("device", device) != device:
            continue
        cursor: Any = segment.get("address")
        for block in segment.get("blocks") or []:
            if not isinstance(block, dict) or type(cursor) is not int:
                break
            here = block.get("address", cursor)
            size = block.get("size")
            if type(size) is not int:
                break
            requested = block.get("requested_size", size)
            if block.get("state") == "active_allocated" and here not in live \
                    and type(requested) is int and requested > 0:
                early.append(Event(ALLOC, next_id, requested, segment.get("stream", 0) or 0,
                                   None, _tag(block)))
                next_id += 1
            cursor = here + size
    counts["preexisting"] = len(early)
    if start is not None:
        early = [e._replace(time_us=start) for e in early]
    metadata = {"format": "pytorch_snapshot", "device": str(device)}
    metadata.update({key: str(value) for key, value in counts.items()})
    return early + events, metadata


def read_snapshot(source: str | os.PathLike[str] | IO[bytes], *, device: int | None = None,
                  name: str | None = None) -> Trace:
    """Read a PyTorch memory snapshot pickle as a checked :class:`Trace` (never runs code)."""
    if is_path(source):
        path = Path(source)  # type: ignore[arg-type]
        try:
            with path.open("rb") as handle:
                data = load_plain(handle, name=str(path))
        except OSError as exc:
            raise MalformedTraceError(f"cannot read {str(path)!r}: {exc.strerror or exc}"
                                      ) from exc
        name = name or path.stem
    else:
        data = load_plain(source)  # type: ignore[arg-type]
    events, metadata = snapshot_events(data, device=device)
    return Trace.from_events(events, name=name or "snapshot", metadata=metadata)
