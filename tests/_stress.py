"""A threaded stress driver shared by the adaptor tests (not a benchmark: it checks, never times).

Every worker allocates blocks of mixed sizes, fills each with its own byte, checks the fill before
freeing, and hands some blocks to other workers through a queue so that blocks are freed by a
thread other than the one that allocated them. Every live address is recorded in one dict under a
lock: an address handed out while it is still live elsewhere is a duplicate, reported at once.
The switch interval is shortened so that threads interleave inside the adaptors' hot paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import queue
import random
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIZES = (8, 64, 100, 256, 1000, 4096, 20000)


@contextmanager
def fast_switching() -> Iterator[None]:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def stress(resource: object, *, threads: int = 8, operations: int = 1500, seed: int = 0) -> None:
    """Run the workload; raise AssertionError describing the first problem any worker saw."""
    allocate = resource.allocate  # type: ignore[attr-defined]
    deallocate = resource.deallocate  # type: ignore[attr-defined]
    live: dict[int, tuple[int, int]] = {}  # address -> (nbytes, owner thread)
    live_lock = threading.Lock()
    handoff: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
    problems: list[str] = []
    barrier = threading.Barrier(threads)

    def free(address: int, nbytes: int, fill: int) -> None:
        if ctypes.string_at(address, nbytes) != bytes([fill]) * nbytes:
            problems.append(f"block {address:#x} ({nbytes} B) was overwritten while live")
        with live_lock:
            if live.pop(address, None) is None:
                problems.append(f"block {address:#x} freed but not recorded live")
        deallocate(address, nbytes)

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        fill = index + 1
        mine: list[tuple[int, int, int]] = []
        try:
            barrier.wait()
            for _ in range(operations):
                roll = rng.random()
                if mine and roll < 0.40:
                    free(*mine.pop(rng.randrange(len(mine))))
                elif mine and roll < 0.45:
                    handoff.put(mine.pop())
                elif roll < 0.50:
                    with contextlib.suppress(queue.Empty):
                        free(*handoff.get_nowait())  # allocated by another thread
                else:
                    nbytes = rng.choice(SIZES)
                    address = allocate(nbytes)
                    with live_lock:
                        if address in live:
                            problems.append(
                                f"{address:#x} handed out twice (live for thread "
                                f"{live[address][1]}, now thread {index})"
                            )
                        live[address] = (nbytes, index)
                    ctypes.memset(address, fill, nbytes)
                    mine.append((address, nbytes, fill))
                if problems:
                    return
            for block in mine:
                free(*block)
        except Exception as exc:  # report, do not let one worker hide in a thread
            problems.append(f"thread {index}: {type(exc).__name__}: {exc}")

    with fast_switching():
        workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
    while True:
        try:
            free(*handoff.get_nowait())
        except queue.Empty:
            break
    assert not problems, problems[:5]
    assert not live, f"{len(live)} blocks never freed"
