"""Which other Python threads count (interop.other_threads): any but tqdm's progress monitor."""

from __future__ import annotations

import threading

import pytest

from tensorarena.interop.other_threads import is_progress_monitor, other_threads


def test_a_plain_thread_counts_until_it_ends() -> None:
    before = other_threads()
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="worker")
    thread.start()
    try:
        assert thread in other_threads() and not is_progress_monitor(thread)
    finally:
        release.set()
        thread.join()
    assert thread not in other_threads() and other_threads() == before
    assert threading.current_thread() not in other_threads()


def test_tqdms_progress_monitor_does_not_count() -> None:
    tqdm = pytest.importorskip("tqdm")
    monitor = tqdm.std.TMonitor(tqdm.tqdm, 10.0)  # what a progress bar starts
    try:
        assert is_progress_monitor(monitor) and monitor.is_alive()
        assert monitor not in other_threads()
    finally:
        monitor.exit()
