"""A step's log kept in C++, shared with the route's native server: a :class:`Recorder` that
costs no Python int per allocation.

Under :func:`tensorarena.torch.learned` most of a repeating step's allocations are served by the
route's server with no Python call (:mod:`~tensorarena.learned.native_serving`). The step's log
(sizes, alignments, lifetimes on the step's clock: :mod:`~tensorarena.learned.recording`) is
then kept where they happen: a :class:`NativeRecorder` is a handle on a ``StepLog`` of the shim
(``_torch_cpu_step_log.h``), which the server logs into as it serves and frees and the plans log
into through the same methods as a :class:`Recorder`'s. At the step's marker the step is compared
with its plan in C++ (:meth:`matches`, :meth:`same`: exact, over every size and every block that
outlived the step); the log becomes Python lists only when a plan is learned from it
(:meth:`finish`, :meth:`signature`). Once :meth:`end` is called nothing is served into it and
no free is logged there (as a :class:`Recorder`); a free in the next step is carried into it.
"""

from __future__ import annotations

from typing import Any

from tensorarena.learned.recording import Recorder, Signature, StepRecording

__all__ = ["NativeRecorder"]


class NativeRecorder(Recorder):
    """A :class:`Recorder` whose log is the shim's (``shim``: the compiled extension,
    :func:`tensorarena.interop.torch_cpu_shim.extension`); :attr:`log` is its capsule."""

    __slots__ = ("_shim", "log")

    def __init__(self, shim: Any) -> None:  # (the Python lists of a Recorder stay unused)
        self._shim = shim
        self.log = shim.step_log_new()

    def __len__(self) -> int:
        return int(self._shim.step_log_length(self.log))

    @property
    def clock(self) -> int:
        """The current tick."""
        return int(self._shim.step_log_clock(self.log))

    def allocated(self, nbytes: int, alignment: int) -> int:
        """Log an allocation; return its number."""
        return int(self._shim.step_log_allocated(self.log, nbytes, alignment))

    def freed(self, index: int) -> None:
        """Log the free of allocation ``index`` (nothing once the step ended)."""
        self._shim.step_log_freed(self.log, index)

    def end(self, *, learned: bool) -> None:
        """The step ended: nothing more is served into it or logged as freed (frees of its
        blocks in the next step are carried into it when ``learned``)."""
        self._shim.step_log_end(self.log, learned)

    def matches(self, signature: Signature) -> bool:
        """True if the log's signature is ``signature`` (compared in C++)."""
        return bool(self._shim.step_log_matches(self.log, *signature))

    def same(self, other: Recorder) -> bool:
        """True if the two logs have one signature (compared in C++ when both are native)."""
        if isinstance(other, NativeRecorder):
            return bool(self._shim.step_log_same(self.log, other.log))
        return self.signature() == other.signature()

    def key(self, length: int) -> tuple[int, ...]:
        """The sizes of the first ``length`` allocations."""
        return tuple(self._shim.step_log_key(self.log, length))

    def lists(self) -> Recorder:
        """The log now, as a Python :class:`Recorder`."""
        sizes, alignments, starts, ends = self._shim.step_log_lists(self.log)
        return Recorder.of_lists(sizes, alignments, starts, ends, self.clock)

    def signature(self) -> Signature:
        """:meth:`Recorder.signature` of the log (made in Python)."""
        return self.lists().signature()

    def start_of(self, index: int) -> int:
        """The tick at which allocation ``index`` was made."""
        return self.lists().start_of(index)

    def finish(self, first: int = 0, last: int | None = None,
               until: int | None = None) -> StepRecording:
        """:meth:`Recorder.finish` of the log."""
        return self.lists().finish(first, last, until)

    def __repr__(self) -> str:
        return f"NativeRecorder(allocations={len(self)}, clock={self.clock})"
