"""Several observers per pool, and a hook on every pool of the process (pool_observers)."""

from __future__ import annotations

import contextlib
import gc
import weakref

from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.pool_observers import watch_pools


class Seen:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def allocated(self, address: int, nbytes: int) -> None:
        self.calls.append(("allocated", nbytes))

    def freed(self, address: int, nbytes: int) -> None:
        self.calls.append(("freed", nbytes))

    def out_of_memory(self, nbytes: int) -> None:
        self.calls.append(("out_of_memory", nbytes))


def test_two_observers_each_see_every_call_and_one_removed_sees_no_more() -> None:
    pool = Pool(HostMemory(), initial_size=0, maximum_size="1MiB")
    first, second = Seen(), Seen()
    pool.add_observer(first)
    pool.add_observer(second)
    pool.deallocate(pool.allocate(100), 100)
    pool.remove_observer(first)
    pool.remove_observer(first)  # not observing: ignored
    pool.deallocate(pool.allocate(200), 200)
    with contextlib.suppress(MemoryError):
        pool.allocate(2 << 20)
    assert first.calls == [("allocated", 100), ("freed", 100)]
    assert second.calls == [("allocated", 100), ("freed", 100), ("allocated", 200),
                            ("freed", 200), ("out_of_memory", 2 << 20)]
    pool.remove_observer(second)
    pool.deallocate(pool.allocate(8), 8)
    assert len(second.calls) == 5


def test_the_history_slot_replaces_only_its_own_observer() -> None:
    pool = Pool(HostMemory(), initial_size=0)
    other, history, newer = Seen(), Seen(), Seen()
    pool.add_observer(other)
    pool._set_observer(history)
    pool._set_observer(newer)  # replaces history, keeps other
    pool.deallocate(pool.allocate(64), 64)
    pool._set_observer(None)
    pool.deallocate(pool.allocate(32), 32)
    assert history.calls == []
    assert newer.calls == [("allocated", 64), ("freed", 64)]
    assert other.calls == [("allocated", 64), ("freed", 64), ("allocated", 32), ("freed", 32)]


def test_watch_pools_sees_pools_alive_and_made_later_until_stopped() -> None:
    before = Pool(HostMemory(), initial_size=0)
    seen: list[object] = []
    stop = watch_pools(seen.append)
    during = Pool(HostMemory(), initial_size=0)
    stop()
    stop()  # idempotent
    after = Pool(HostMemory(), initial_size=0)
    assert any(p is before for p in seen) and any(p is during for p in seen)
    assert not any(p is after for p in seen)
    gone = weakref.ref(during)
    seen.clear()
    del during
    gc.collect()
    assert gone() is None  # the registry does not keep a pool alive
