"""Record what a real PyTorch program allocates: ``with record_torch() as rec: ...``.

PyTorch's profiler, with ``profile_memory=True``, reports every call into the allocator of each
device — its pointer, its size (negative for a free), the time and the op that made it — without
changing what the program does. :func:`record_torch` runs the block under the profiler and turns
those reports into a :class:`~tensorarena.trace.Trace` (``rec.trace`` once the block ends): each
allocation a new id, its ``tag`` the ATen op it was made in (``aten::mm``; empty outside any op),
times in microseconds from the first event. Only the chosen device's allocations count (the CPU
by default; ``"cuda"`` where there is one).

The trace is what the block did: blocks allocated before it never appear, even when the block
frees them (PyTorch's CPU profiler does not report those frees: it warns that a "memory block of
unknown size was allocated before the profiling started"). Where a device's profiler does report
such a free, the block becomes an allocation at the start of the trace, counted in
``metadata["preexisting"]`` (the convention of PyTorch's own memory viewer).

The profiler slows the program down (each op is recorded): record for the allocation pattern,
never for time. ``tensorarena trace record -o out.csv -- python script.py`` records a whole
script this way (:func:`record_script`, in a fresh interpreter).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError
from tensorarena.trace.model import ALLOC, FREE, Event, Trace
from tensorarena.trace.profiler_allocations import profiler_allocations

__all__ = ["TorchRecording", "record_script", "record_torch"]


class TorchRecording:
    """What :func:`record_torch` yields: ``trace`` is set when the ``with`` block ends."""

    def __init__(self, name: str, device: str) -> None:
        self.name = name
        self.device = device
        self._trace: Trace | None = None

    @property
    def trace(self) -> Trace:
        """The recorded trace (raises until the ``with`` block has ended)."""
        if self._trace is None:
            raise InvalidArgumentError("the recording is still running: read .trace after the "
                                       "with block")
        return self._trace

    def _finish(self, raw: list[tuple[int, int, int, str]]) -> None:
        """Turn ``(time_ns, ptr, signed size, op)`` reports, in order, into the trace."""
        raw.sort(key=lambda report: report[0])
        start = raw[0][0] if raw else 0
        ids: dict[int, tuple[int, int]] = {}  # live pointer -> (id, nbytes)
        early: list[Event] = []
        events: list[Event] = []
        next_id = 0
        for time_ns, pointer, size, op in raw:
            time_us = (time_ns - start) // 1000
            if size > 0:
                if pointer in ids:  # a report lost by the profiler: close the older one
                    old, nbytes = ids.pop(pointer)
                    events.append(Event(FREE, old, nbytes, 0, time_us, ""))
                ids[pointer] = (next_id, size)
                events.append(Event(ALLOC, next_id, size, 0, time_us, op))
                next_id += 1
            elif size < 0:
                known = ids.pop(pointer, None)
                if known is None:  # allocated before the recording started
                    known = (next_id, -size)
                    next_id += 1
                    early.append(Event(ALLOC, known[0], -size, 0, 0, "preexisting"))
                events.append(Event(FREE, known[0], known[1], 0, time_us, ""))
        self._trace = Trace.from_events(
            early + events, name=self.name,
            metadata={"format": "torch_profiler", "device": self.device,
                      "preexisting": str(len(early))})


def _reports(profile: Any, device: str) -> list[tuple[int, int, int, str]]:
    """``(time_ns, ptr, signed size, op name)`` of every allocator report on ``device``, latest
    in the tree first: the order that reports of one nanosecond have always kept."""
    return [(a.time_ns, a.address, a.nbytes, a.op)
            for a in reversed(profiler_allocations(profile).allocations)
            if a.device == device and a.nbytes]


@contextlib.contextmanager
def record_torch(*, name: str = "torch", device: str = "cpu") -> Iterator[TorchRecording]:
    """Record the PyTorch allocations of the ``with`` block (see the module docstring)."""
    torch = require("torch", extra="torch", feature="tensorarena.trace.record_torch")
    if device not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"device must be 'cpu' or 'cuda', got {device!r}")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    recording = TorchRecording(name, device)
    with torch.profiler.profile(activities=activities, profile_memory=True) as profile:
        yield recording
    recording._finish(_reports(profile, device))


def record_script(command: Sequence[str], *, name: str | None = None,
                  device: str = "cpu") -> Trace:
    """Run a Python program in this interpreter under :func:`record_torch`; return its trace.

    ``command`` is what follows ``python``: ``["script.py", "arg"...]`` or
    ``["-m", "module", "arg"...]``. ``sys.argv`` is set as the program expects; a
    ``SystemExit(0)`` (or ``None``) ends the recording normally, any other exit is raised.
    """
    if not command:
        raise InvalidArgumentError("nothing to record: give a script (or -m MODULE)")
    module = command[0] == "-m"
    if module and len(command) < 2:
        raise InvalidArgumentError("-m needs a module name")
    target = command[1] if module else command[0]
    argv = list(command[1:] if module else command)
    saved, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    try:
        with record_torch(name=name or os.path.splitext(os.path.basename(target))[0],
                          device=device) as recording:
            try:
                if module:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(target, run_name="__main__")
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    raise
    finally:
        sys.argv, sys.path[:] = saved, saved_path
    return recording.trace
