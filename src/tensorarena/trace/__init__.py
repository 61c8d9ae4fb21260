"""Allocation traces: record what a program allocates, convert peers' formats, replay anywhere.

One trace model (:class:`Event`: allocate/free of an id, with size, stream, time and tag;
:class:`Trace`: a checked sequence of them) and every format behind :func:`read_trace`,
:func:`iter_events` (streaming) and :func:`write_trace`: our CSV (``op,id,size`` at minimum),
RMM's logging CSV, and PyTorch's memory-snapshot pickle (read through an unpickler that cannot
run code; written so that PyTorch's viewer opens it — :func:`write_snapshot` and
:func:`build_snapshot` are the writer other layers reuse).

The :class:`~tensorarena.adaptors.Logging` adaptor records any resource (:class:`EventRecorder`
turns its records into events); :func:`record_torch` records real PyTorch programs, and three
traces it made from ``transformers`` models ship with the package (:func:`shipped_traces`).
:func:`replay` drives any resource through a trace and reports footprint, fragmentation and time
(:class:`ReplayResult`); :class:`PyTorchLike` is PyTorch's caching-allocator policy as a
resource; :mod:`tensorarena.trace.configs` names the configurations the command line compares
and :func:`recommend` ranks them on a trace.

``import tensorarena.trace`` needs only NumPy; the torch recorder imports torch when used.
"""

from tensorarena.trace.csv_format import CsvWriter, iter_csv, write_csv
from tensorarena.trace.formats import (
    FORMATS,
    detect_format,
    iter_events,
    read_trace,
    write_trace,
)
from tensorarena.trace.model import (
    ALLOC,
    FREE,
    SITE_SEPARATOR,
    Event,
    LiveSet,
    MalformedTraceError,
    Trace,
    TraceSummary,
    summarize,
)
from tensorarena.trace.plain_pickle import UnsafePickleError
from tensorarena.trace.pool_recorder import PoolRecording
from tensorarena.trace.pytorch_like import BlockState, PyTorchLike, SegmentState
from tensorarena.trace.recommend import Recommendation, recommend
from tensorarena.trace.recorder import EventRecorder, trace_from_log
from tensorarena.trace.replay import ReplayResult, replay, statistics_of
from tensorarena.trace.rmm_format import iter_rmm, write_rmm
from tensorarena.trace.snapshot import (
    SnapshotAction,
    actions_from_log,
    build_snapshot,
    pool_segments,
    read_snapshot,
    snapshot_events,
    snapshot_of,
    write_snapshot,
)
from tensorarena.trace.torch_recorder import (
    ScriptRun,
    TorchRecording,
    record_script,
    record_torch,
    run_script,
)
from tensorarena.trace.workloads import WORKLOADS, shipped_traces

__all__ = [
    "ALLOC",
    "FORMATS",
    "FREE",
    "SITE_SEPARATOR",
    "WORKLOADS",
    "BlockState",
    "CsvWriter",
    "Event",
    "EventRecorder",
    "LiveSet",
    "MalformedTraceError",
    "PoolRecording",
    "PyTorchLike",
    "Recommendation",
    "ReplayResult",
    "ScriptRun",
    "SegmentState",
    "SnapshotAction",
    "TorchRecording",
    "Trace",
    "TraceSummary",
    "UnsafePickleError",
    "actions_from_log",
    "build_snapshot",
    "detect_format",
    "iter_csv",
    "iter_events",
    "iter_rmm",
    "pool_segments",
    "read_snapshot",
    "read_trace",
    "recommend",
    "record_script",
    "record_torch",
    "replay",
    "run_script",
    "shipped_traces",
    "snapshot_events",
    "snapshot_of",
    "statistics_of",
    "summarize",
    "trace_from_log",
    "write_csv",
    "write_rmm",
    "write_snapshot",
    "write_trace",
]
