"""``use(NativePool(...))`` at the edges of a process: fork, torch's own threads (no GIL, no
Python thread state) allocating and freeing natively, and exit with routed tensors alive. Each
runs in a child interpreter (a crash fails the test, not the run)."""

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


def test_a_forked_child_allocates_and_frees_on_its_copy_of_the_pool(shim: Any) -> None:
    out = run("""
        import os, torch
        from tensorarena.torch import NativePool, use

        pool = NativePool(size="16MiB")
        route = use(pool)
        before = torch.full((1000,), 7.0)
        pid = os.fork()
        if pid == 0:
            ok = float(before.sum()) == 7000.0
            del before
            again = torch.ones(2000)
            ok = ok and pool.owns(again.data_ptr()) and pool.statistics().allocations.current == 1
            del again
            route.uninstall()
            ok = ok and pool.statistics().allocations.current == 0
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert float(before.sum()) == 7000.0 and pool.statistics().allocations.current == 1
        route.uninstall()
        del before
        print(pool.statistics().allocations.current,
              pool.served == route.statistics().allocations.total)
    """)
    assert out == "0 True"


def test_torchscript_tasks_on_torchs_threads_take_and_free_natively(shim: Any) -> None:
    out = run("""
        import time
        import torch
        from tensorarena.torch import NativePool, use

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
        for _ in range(3):
            unit.outer(x)
        pool = NativePool(size="16MiB")
        with use(pool, threads="all") as route:
            result = unit.outer(x)
        assert result.flatten().tolist() == [50 * 3.0 * 4096] * 4, result
        del result
        for _ in range(500):
            if pool.statistics().allocations.current == 0:
                break
            time.sleep(0.01)
        stats = route.statistics()
        print(stats.allocations.current, pool.statistics().allocations.current,
              pool.served == stats.allocations.total >= 4 * 50)
    """)
    assert out == "0 0 True"


def test_routed_tensors_alive_at_exit_do_not_crash_the_interpreter(shim: Any) -> None:
    out = run("""
        import torch
        from tensorarena.torch import NativePool, use

        pool = NativePool(size="16MiB")
        use(pool)  # never uninstalled
        KEPT = torch.ones(5000)
        CYCLE = [torch.ones(10)]; CYCLE.append(CYCLE)
        print("ok")
    """)
    assert out == "ok"
