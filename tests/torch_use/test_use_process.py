"""``tensorarena.torch.use`` at the edges of a process: interpreter shutdown with routed tensors
alive, fork, and threads torch runs without the GIL. Each runs in a child interpreter (a crash
there fails the test instead of the run); the shim is built by the fixture first, so the child
finds it cached."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout.strip()


def test_routed_tensors_alive_at_exit_do_not_crash_the_interpreter(shim: Any) -> None:
    out = run("""
        import threading, torch
        import tensorarena as ta
        from tensorarena.torch import use

        pool = ta.Pool(ta.HostMemory())
        kept = []
        def worker():
            kept.append(torch.ones(1000))
        use(pool)                       # never uninstalled
        KEPT_GLOBAL = torch.ones(5000)  # freed while the interpreter tears the module down
        t = threading.Thread(target=worker, daemon=True); t.start(); t.join()
        left = use(ta.Pool(ta.HostMemory()))
        CYCLE = [torch.ones(10)]; CYCLE.append(CYCLE)
        left.uninstall()
        print("ok")
    """)
    assert out == "ok"


def test_a_forked_child_frees_and_allocates_on_its_copy(shim: Any) -> None:
    out = run("""
        import os, torch
        import tensorarena as ta
        from tensorarena.torch import use

        pool = ta.Pool(ta.HostMemory())
        route = use(pool)
        before = torch.full((1000,), 7.0)
        pid = os.fork()
        if pid == 0:
            ok = float(before.sum()) == 7000.0
            del before
            again = torch.ones(2000)
            ok = ok and pool.statistics().allocations.current == 1
            ok = ok and route.statistics().allocations.current == 1
            ok = ok and ta.torch.routed_blocks() == 1
            del again
            route.uninstall()
            os._exit(0 if ok and pool.statistics().allocations.current == 0 else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert float(before.sum()) == 7000.0 and pool.statistics().allocations.current == 1
        route.uninstall()
        del before
        assert pool.statistics().allocations.current == 0
        print("ok")
    """)
    assert out == "ok"


def test_torchscript_tasks_on_torchs_own_threads_allocate_and_free_through_the_route(
        shim: Any) -> None:
    # torch.jit.fork inside a scripted function runs its task on torch's inter-op pool: C++
    # threads with no GIL and no Python thread state. "calling" leaves them to torch (at most the
    # stacked result is the calling thread's: the script may resume after its wait on the task's
    # thread); "all" serves theirs (4 tasks x 50 sums at least).
    out = run("""
        import time
        import torch
        import tensorarena as ta
        from tensorarena.torch import use

        unit = torch.jit.CompilationUnit('''
        def inner(x: Tensor) -> Tensor:
            total = torch.zeros(1)
            for _ in range(50):
                total = total + (x * 2.0 + 1.0).sum()
            return total

        def outer(x: Tensor) -> Tensor:
            futures = [torch.jit.fork(inner, x) for _ in range(4)]
            return torch.stack([torch.jit.wait(f) for f in futures])
        ''')
        x = torch.ones(4096)
        for _ in range(3):  # the profiling executor settles (and keeps its constants) first
            unit.outer(x)
        seen = {}
        for threads in ("calling", "all"):
            pool = ta.Pool(ta.HostMemory())
            with use(pool, threads=threads) as route:
                result = unit.outer(x)
            assert result.flatten().tolist() == [50 * 3.0 * 4096] * 4, result
            del result
            for _ in range(500):  # a task's thread may drop its last tensor after the wait
                if route.statistics().allocations.current == 0:
                    break
                time.sleep(0.01)
            stats = route.statistics()
            assert stats.allocations.current == 0 and pool.statistics().allocations.current == 0
            seen[threads] = stats
        print(seen["calling"].allocations.total <= 1, seen["all"].allocations.total >= 4 * 50)
    """)
    assert out == "True True"


def test_an_interrupted_resource_still_interrupts_the_program(shim: Any) -> None:
    # Ctrl-C inside the resource's allocate must stay a KeyboardInterrupt: as torch's
    # out-of-memory error, a program catching RuntimeError would swallow it.
    out = run("""
        import torch
        import tensorarena as ta
        from tensorarena.torch import use

        class Interrupted:
            memory_kind = ta.MemoryKind.HOST
            def allocate(self, nbytes, alignment=256, stream=None):
                raise KeyboardInterrupt("in allocate")
            def deallocate(self, address, nbytes, stream=None):
                pass

        route = use(Interrupted())
        try:
            try:
                torch.empty(100)
            except RuntimeError:
                pass
            print("not interrupted")
        except KeyboardInterrupt as error:
            print("interrupted", error, route.last_error is error)
        route.uninstall()
        print(route.statistics().num_ooms, float(torch.ones(3).sum()))
    """)
    assert out == "interrupted in allocate True\n1 3.0"
