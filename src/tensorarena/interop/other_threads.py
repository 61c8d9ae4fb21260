"""The other Python threads that a process-wide step must wait for (a fork, MKL's caches).

Every thread but the calling one, except tqdm's progress monitor: it only wakes progress bars
(FX's interpreter and model downloads start one, and it stays for the process), never holds a
lock a child would need and never calls into torch, so counting it would turn such a step off
in most processes that ever showed a progress bar.
"""

from __future__ import annotations

import threading

__all__ = ["is_progress_monitor", "other_threads"]


def is_progress_monitor(thread: threading.Thread) -> bool:
    """Whether ``thread`` is tqdm's progress monitor (``tqdm.TMonitor``)."""
    return type(thread).__name__ == "TMonitor" and type(thread).__module__.startswith("tqdm")


def other_threads() -> list[threading.Thread]:
    """The Python threads running besides the calling one, tqdm's monitor aside."""
    me = threading.current_thread()
    return [t for t in threading.enumerate() if t is not me and not is_progress_monitor(t)]
