"""The shim's build takes turns under an flock, and clears the lock file a killed build left."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tensorarena.interop.torch_cpu_shim import build_once

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")

HOLD = """
import fcntl, sys, time
held = open(sys.argv[1], "a")
fcntl.flock(held.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)
"""


def test_a_lock_file_left_by_a_killed_build_is_cleared_and_the_build_runs(tmp_path: Path) -> None:
    (tmp_path / "lock").write_text("")  # what torch's FileBaton leaves when its build is killed
    seen = []

    def build() -> str:
        seen.append((tmp_path / "lock").exists())
        return "module"

    assert build_once(tmp_path, build) == "module"
    assert seen == [False]


def test_a_build_waits_for_a_live_builder_and_goes_on_once_it_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "build.flock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        built = threading.Event()
        waiter = threading.Thread(target=build_once, args=(tmp_path, built.set), daemon=True)
        waiter.start()
        waiter.join(0.3)
        assert not built.is_set()  # never while another process holds the folder
        holder.send_signal(signal.SIGKILL)  # dies mid-build: the system drops its flock
        waiter.join(30)
        assert built.is_set()
    finally:
        holder.kill()
        holder.wait()


def test_a_failed_build_lets_the_next_one_in(tmp_path: Path) -> None:
    def fail() -> None:
        raise RuntimeError("compiler error")

    with pytest.raises(RuntimeError, match="compiler error"):
        build_once(tmp_path, fail)
    assert build_once(tmp_path, lambda: 7) == 7
