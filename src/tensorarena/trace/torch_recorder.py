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

tensorarena's own memory is recorded too (``pools=True``, the default): every pool of the process,
the default resource's included (:mod:`tensorarena.trace.pool_recorder`), merged with torch's
allocations by time. Each event says which allocator served it (``allocator``: ``"torch"``,
``"tensorarena/default"``, ``"tensorarena/pool1"``...) and, with ``stack_depth`` > 0 (8 by
default), where it was made (``site``: the program's Python frames, innermost first; the
profiler runs ``with_stack=True`` for torch's).

The profiler slows the program down (each op is recorded): record for the allocation pattern,
never for time. ``tensorarena trace record -o out.csv -- python script.py`` records a whole
script this way (:func:`record_script`, in a fresh interpreter).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import runpy
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tensorarena._optional import require
from tensorarena.adaptors.tracking import check_stack_depth
from tensorarena.errors import InvalidArgumentError
from tensorarena.trace.model import ALLOC, FREE, Event, Trace
from tensorarena.trace.pool_recorder import PoolRecording, Report, keep_frame, site_text
from tensorarena.trace.profiler_allocations import profiler_allocations

__all__ = ["ScriptRun", "TorchRecording", "record_script", "record_torch", "run_script",
           "without_routed"]


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

    def _finish(self, raw: list[Report], *, partial: str = "", failures: int = 0) -> None:
        """Turn ``(time_ns, ptr, signed size, op, allocator, site)`` reports into the trace;
        ``partial`` says why it ends early (``metadata["partial"]``)."""
        raw.sort(key=lambda report: report[0])
        start = raw[0][0] if raw else 0
        ids: dict[tuple[str, int], tuple[int, int]] = {}  # live (allocator, ptr) -> (id, nbytes)
        early: list[Event] = []
        events: list[Event] = []
        next_id = 0
        for time_ns, pointer, size, op, allocator, site in raw:
            time_us = (time_ns - start) // 1000
            key = (allocator, pointer)
            if size > 0:
                if key in ids:  # a report lost by the profiler: close the older one
                    old, nbytes = ids.pop(key)
                    events.append(Event(FREE, old, nbytes, 0, time_us, "", allocator))
                ids[key] = (next_id, size)
                events.append(Event(ALLOC, next_id, size, 0, time_us, op, allocator, site))
                next_id += 1
            elif size < 0:
                known = ids.pop(key, None)
                if known is None:  # allocated before the recording started
                    known = (next_id, -size)
                    next_id += 1
                    early.append(Event(ALLOC, known[0], -size, 0, 0, "preexisting", allocator))
                events.append(Event(FREE, known[0], known[1], 0, time_us, "", allocator))
        metadata = {"format": "torch_profiler", "device": self.device,
                    "preexisting": str(len(early))}
        if failures:
            metadata["failures"] = str(failures)
        if partial:
            metadata["partial"] = partial
        self._trace = Trace.from_events(early + events, name=self.name, metadata=metadata)


def _reports(profile: Any, device: str, stack_depth: int) -> list[Report]:
    """The reports of every allocator call on ``device``, latest in the tree first: the order
    that reports of one nanosecond have always kept."""
    sites: dict[Any, str] = {}
    found = profiler_allocations(profile, stack_depth=stack_depth, keep_frame=keep_frame)
    return [(a.time_ns, a.address, a.nbytes, a.op, "torch", site_text(a.stack, sites))
            for a in reversed(found.allocations) if a.device == device and a.nbytes]


def without_routed(reports: list[Report], pooled: list[Report]) -> list[Report]:
    """Torch's reports less those of blocks a tensorarena pool served: a route
    (:func:`tensorarena.torch.use`) reports its allocations to torch's profiler too, and the
    pool's report of the same block (its allocator and site) is the one kept."""
    served = collections.Counter((address, signed) for _, address, signed, _, _, _ in pooled)
    kept = []
    for report in reports:
        key = (report[1], report[2])  # the address and the size, negative for a free
        if served[key]:
            served[key] -= 1
        else:
            kept.append(report)
    return kept


@contextlib.contextmanager
def record_torch(*, name: str = "torch", device: str = "cpu", pools: bool = True,
                 stack_depth: int = 8) -> Iterator[TorchRecording]:
    """Record the PyTorch allocations of the ``with`` block and, with ``pools``, those of
    every tensorarena pool, each with ``stack_depth`` frames of its site (see the module
    docstring)."""
    torch = require("torch", extra="torch", feature="tensorarena.trace.record_torch")
    if device not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"device must be 'cpu' or 'cuda', got {device!r}")
    depth = check_stack_depth(stack_depth)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    recording = TorchRecording(name, device)
    ours = PoolRecording(stack_depth=depth)

    profile: Any = None  # stays None when the profiler itself fails to start

    def finish(partial: str = "") -> None:
        ours.stop()
        pooled = ours.reports()
        reports = [] if profile is None else _reports(profile, device, depth)
        recording._finish(without_routed(reports, pooled) + pooled, partial=partial,
                          failures=ours.failures)

    try:
        with torch.profiler.profile(activities=activities, profile_memory=True,
                                    with_stack=depth > 0) as profile:
            if pools:
                ours.start()
            yield recording
            ours.stop()  # before the profiler's own teardown allocates
    except BaseException as exc:  # what ran until then is the trace, marked partial
        finish(f"the block raised {type(exc).__name__}")
        raise
    finish()


@dataclass(frozen=True)
class ScriptRun:
    """How a recorded program ended: its ``trace`` (``metadata["partial"]`` says why when it
    ended early), the ``exit_status`` ``python SCRIPT`` would have had (0; a ``SystemExit``'s
    code; 1 for an exception; 130 for Ctrl-C; 128 + the signal for SIGTERM) and the ``error``
    that ended it, if any."""

    trace: Trace
    exit_status: int
    error: BaseException | None = None


class _Terminated(BaseException):
    """SIGTERM, raised in the program so that its recording ends like a Ctrl-C."""


def run_script(command: Sequence[str], *, name: str | None = None,
               device: str = "cpu", pools: bool = True, stack_depth: int = 8) -> ScriptRun:
    """Run a Python program in this interpreter under :func:`record_torch`, whatever its end.

    ``command`` is what follows ``python``: ``["script.py", "arg"...]`` or
    ``["-m", "module", "arg"...]``; ``sys.argv`` is set as the program expects. A program that
    raises, exits non-zero or is interrupted (Ctrl-C; SIGTERM, where this is the main thread)
    still gives the trace of what it did, marked partial. ``pools`` and ``stack_depth`` are
    :func:`record_torch`'s.
    """
    if not command:
        raise InvalidArgumentError("nothing to record: give a script (or -m MODULE)")
    module = command[0] == "-m"
    if module and len(command) < 2:
        raise InvalidArgumentError("-m needs a module name")
    target = command[1] if module else command[0]
    _check_runnable(target, module=module)
    argv = list(command[1:] if module else command)
    saved, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    if not module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    recording = TorchRecording("", device)
    status: int = 0
    error: BaseException | None = None
    try:
        with _terminating_raises(), record_torch(
                name=name or os.path.splitext(os.path.basename(target))[0],
                device=device, pools=pools, stack_depth=stack_depth) as recording:
            _run(target, module=module)
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
        error = exit_ if status else None
    except KeyboardInterrupt as exc:
        status, error = 130, exc
    except _Terminated as exc:
        status, error = 128 + signal.SIGTERM, exc
    except Exception as exc:
        status, error = 1, exc
    finally:
        sys.argv, sys.path[:] = saved, saved_path
    if recording._trace is None:  # the recording itself could not start (torch missing)
        assert error is not None
        raise error
    metadata = {k: v for k, v in recording.trace.metadata.items() if k != "partial"}
    if error is not None:
        metadata["partial"] = _why_partial(error, status)
    trace = Trace.from_events(recording.trace, name=recording.trace.name, metadata=metadata)
    return ScriptRun(trace, status, error)


def _why_partial(error: BaseException, status: int) -> str:
    if isinstance(error, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(error, _Terminated):
        return "terminated (SIGTERM)"
    if isinstance(error, SystemExit):
        return f"the program exited with status {status}"
    return f"the program raised {type(error).__name__}: {error}"


def record_script(command: Sequence[str], *, name: str | None = None,
                  device: str = "cpu", pools: bool = True, stack_depth: int = 8) -> Trace:
    """:func:`run_script`, raising what ended the program early instead of returning it."""
    run = run_script(command, name=name, device=device, pools=pools, stack_depth=stack_depth)
    if run.error is not None:
        raise run.error
    return run.trace


def _check_runnable(target: str, *, module: bool) -> None:
    """A script that is not there, or a module that cannot be found, is refused before the
    recording starts (``python`` itself refuses them before running anything)."""
    if not module:
        if not os.path.isfile(target):
            raise InvalidArgumentError(f"no script {target!r} to record")
        return
    try:
        found = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise InvalidArgumentError(f"no module named {target!r} to record")


def _run(target: str, *, module: bool) -> None:
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")


def _exit_status(code: object) -> int:
    """The status ``python`` exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool):
        return code & 0xFF
    return 1  # a message: printed, status 1


@contextlib.contextmanager
def _terminating_raises() -> Iterator[None]:
    """SIGTERM raises :class:`_Terminated` in the main thread while the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
