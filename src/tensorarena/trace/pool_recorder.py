"""Record tensorarena's own memory: every pool of the process, as a whole-program trace sees it.

A program that runs PyTorch and tensorarena side by side holds memory in both: torch's allocator
(recorded through PyTorch's profiler, :mod:`tensorarena.trace.torch_recorder`) and tensorarena's
pools — the default resource's (``empty``, planned programs' arenas), and any the program made.
:class:`PoolRecording` observes every one of them
(:func:`~tensorarena.memory.pool_observers.watch_pools`: those alive when it starts and those
made later) and keeps one report per call: ``(time_ns, address, signed size, op, allocator,
site)``, the shape of the profiler's reports, so the two merge into one trace by time
(``time.time_ns``, the profiler's clock).

Which pools: those over memory (host, pinned, device), not those over address space only
(a :class:`~tensorarena.memory.VirtualMemory` pool is bookkeeping: ``viz`` replays traces on
one). Each pool is named by its ``allocator`` label: ``tensorarena/default`` for the default
resource's pool, ``tensorarena/pool1``, ``tensorarena/pool2``... for the others in the order they
were first seen. A thread cache in front of a pool (the default resource has one) serves repeat
small requests without calling the pool: the trace shows the pool's calls, as PyTorch's memory
history shows its caching allocator's, not each tensor's. A pool over another pool shows twice:
the upper pool's arenas are blocks of the lower one.

Sites: with ``stack_depth`` > 0 each call keeps that many frames of the Python stack of the code
that called into tensorarena (:func:`tensorarena.adaptors.sites.capture`; its cost is in
bench/RESULTS.md),
formatted once per distinct stack and shared (interned), so a loop that allocates a million
times from one line keeps one string.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tensorarena.adaptors.sites import Stack, capture, is_tensorarena_file
from tensorarena.memory.pool import Pool
from tensorarena.memory.pool_observers import watch_pools
from tensorarena.memory.resource import resource_stack
from tensorarena.memory_kind import MemoryKind, memory_kind_of
from tensorarena.trace.model import SITE_SEPARATOR

__all__ = ["PoolRecording", "Report", "keep_frame", "short_path", "site_text"]

_OURS = ("tensorarena/", "tensorarena\\")

Report = tuple[int, int, int, str, str, str]
"""``(time_ns, address, signed size, op, allocator, site)``: a free has a negative size."""


def site_text(stack: Stack, cache: dict[Stack, str] | None = None) -> str:
    """``stack`` as an event's ``site`` (frames joined by ``"; "``), the same string object for
    the same stack when ``cache`` is given."""
    if cache is not None:
        known = cache.get(stack)
        if known is not None:
            return known
    text = SITE_SEPARATOR.join(f"{short_path(f)}:{line} in {function}"
                               for f, line, function in stack if keep_frame(f))
    if cache is not None:
        cache[stack] = text
    return text


_short: dict[str, str] = {}


def short_path(filename: str) -> str:
    """``filename`` relative to the longest ``sys.path`` entry it lies under, as PyTorch's
    profiler names the files of its Python frames (so both allocators' sites read alike)."""
    known = _short.get(filename)
    if known is None:
        known = filename
        if os.path.isabs(filename):
            best = ""
            for entry in sys.path:
                root = os.path.abspath(entry or os.curdir).rstrip(os.sep) + os.sep
                if filename.startswith(root) and len(root) > len(best):
                    best = root
            known = filename[len(best):] if best else filename
        if len(_short) > 65536:
            _short.clear()
        _short[filename] = known
    return known


def keep_frame(filename: str) -> bool:
    """Whether a frame of ``filename`` belongs in a site: the program's and its libraries',
    not the recording machinery's (runpy, tensorarena)."""
    # PyTorch's profiler names files relative to their sys.path entry: "tensorarena/x.py".
    return not (filename.endswith(("runpy>", "runpy.py")) or filename.startswith(_OURS)
                or is_tensorarena_file(filename))


class _Observer:
    """One pool's observer: appends its reports to the recording's list, under its number."""

    __slots__ = ("number", "recording")

    def __init__(self, recording: PoolRecording, number: int) -> None:
        self.recording = recording
        self.number = number

    def allocated(self, address: int, nbytes: int) -> None:
        self.recording._report(address, nbytes, self.number)

    def freed(self, address: int, nbytes: int) -> None:
        self.recording._report(address, -nbytes, self.number)

    def out_of_memory(self, nbytes: int) -> None:
        self.recording.failures += 1


class PoolRecording:
    """Observes every pool of the process between :meth:`start` and :meth:`stop`;
    :meth:`reports` gives what they did (see the module docstring)."""

    def __init__(self, *, stack_depth: int = 8) -> None:
        self.stack_depth = stack_depth
        self.failures = 0
        self._raw: list[tuple[int, int, int, int, str]] = []  # the pool's number for now
        self._sites: dict[Stack, str] = {}
        self._observed: list[tuple[Any, _Observer]] = []
        self._lock = threading.Lock()
        self._stop: Callable[[], None] | None = None

    def start(self) -> None:
        """Observe every pool alive now and every one made until :meth:`stop`."""
        if self._stop is None:
            self._stop = watch_pools(self._attach)

    def stop(self) -> None:
        """Stop observing (the reports stay)."""
        if self._stop is None:
            return
        self._stop()
        self._stop = None
        with self._lock:
            observed = list(self._observed)
        for pool, observer in observed:
            pool.remove_observer(observer)

    def labels(self) -> list[str]:
        """Each observed pool's ``allocator`` label, by its number (the default resource's pool
        is told apart now: it may have been made after the recording started)."""
        default = _default_pool()
        labels, others = [], 0
        for pool, _ in self._observed:
            if pool is default:
                labels.append("tensorarena/default")
            else:
                others += 1
                labels.append(f"tensorarena/pool{others}")
        return labels

    def label_of(self, pool: object) -> str | None:
        """The ``allocator`` label of ``pool``'s events, or None if it is not observed."""
        for (known, _), label in zip(self._observed, self.labels(), strict=True):
            if known is pool:
                return label
        return None

    def reports(self) -> list[Report]:
        """What every observed pool did, in the order it happened."""
        labels = self.labels()
        return [(now, address, signed, "", labels[number], site)
                for now, address, signed, number, site in self._raw]

    def _attach(self, pool: Any) -> None:
        try:
            kind = memory_kind_of(pool)
        except AttributeError:  # an upstream that declares no kind
            kind = None
        if kind is MemoryKind.ADDRESS_SPACE:
            return
        with self._lock:
            observer = _Observer(self, len(self._observed))
            self._observed.append((pool, observer))
        pool.add_observer(observer)

    def _report(self, address: int, signed: int, number: int) -> None:
        now = time.time_ns()
        site = site_text(capture(self.stack_depth), self._sites) if self.stack_depth else ""
        self._raw.append((now, address, signed, number, site))

    def __enter__(self) -> PoolRecording:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _default_pool() -> object:
    """The pool under the default resource, or None while it has not been made."""
    from tensorarena.interop.default import default_resource_if_made

    for layer in resource_stack(default_resource_if_made()):
        if isinstance(layer, Pool):
            return layer
    return None
