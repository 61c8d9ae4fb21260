"""record_memory_history / memory_snapshot / dump_snapshot: PyTorch's calls on our pools, and the
pickle opens in PyTorch's own viewer code."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

import tensorarena as ta
from _source import line_of
from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.report import memory_history, record_memory_history


def _actions(data: dict) -> list[str]:
    return [entry["action"] for entry in data["device_traces"][0]]


def test_a_pools_actions_are_recorded_with_stacks_and_restored_after() -> None:
    pool = Pool(HostMemory(), initial_size="64KiB")
    history = record_memory_history(resource=pool, max_entries=100)
    assert history is not None and memory_history(pool) is history
    a = pool.allocate(1000)  # RECORDED ALLOC
    b = pool.allocate("200KiB")  # grows the pool: a segment_alloc first
    pool.deallocate(a, 1000)
    data = ta.memory_snapshot(pool)
    assert _actions(data) == ["alloc", "segment_alloc", "alloc", "free_requested",
                              "free_completed"]
    first = data["device_traces"][0][0]
    assert (first["addr"], first["size"]) == (a, 1000) and first["time_us"] > 0
    assert first["frames"][0]["line"] == line_of(__file__, "# RECORDED ALLOC")
    assert first["frames"][0]["name"] == (
        "test_a_pools_actions_are_recorded_with_stacks_and_restored_after")
    live = [blk for seg in data["segments"] for blk in seg["blocks"]
            if blk["state"] == "active_allocated"]
    assert [(blk["address"], blk["size"]) for blk in live] == [(b, 200 << 10)]
    assert live[0]["frames"][0]["line"] == first["frames"][0]["line"] + 1
    assert record_memory_history(False, resource=pool) is None
    assert "allocate" not in vars(pool) and "deallocate" not in vars(pool)
    pool.deallocate(b, "200KiB")
    assert memory_history(pool) is None


def test_the_ring_keeps_the_newest_entries_and_stacks_can_be_off() -> None:
    pool = Pool(VirtualMemory())
    history = record_memory_history(resource=pool, max_entries=10, stacks=None)
    assert history is not None
    for _ in range(20):
        pool.deallocate(pool.allocate(64), 64)
    entries = history.entries()
    assert len(history) == 10 and history.max_entries == 10
    assert all(stack == () for _, stack in entries)
    assert entries[-1][0].action == "free_completed"
    record_memory_history(None, resource=pool)


def test_the_default_resource_is_recorded_through_its_thread_cache() -> None:
    previous = ta.set_default_resource(ta.ThreadCached(Pool(HostMemory())))
    try:
        record_memory_history()
        arrays = [ta.empty(1000, np.uint8) for _ in range(3)]
        data = ta.memory_snapshot()
        assert _actions(data).count("alloc") == 3
        del arrays
        record_memory_history(False)
    finally:
        ta.set_default_resource(previous)


def test_an_oom_is_an_action() -> None:
    pool = Pool(VirtualMemory(), initial_size="1MiB", maximum_size="1MiB")
    record_memory_history(resource=pool)
    with pytest.raises(ta.OutOfMemoryError):
        pool.allocate("2MiB")
    oom = ta.memory_snapshot(pool)["device_traces"][0][-1]
    assert oom["action"] == "oom" and oom["size"] == 2 << 20
    record_memory_history(False, resource=pool)


def _allocates_while_the_lock_is_held(pool: Pool) -> bool:
    """Whether ``pool.allocate`` returns while another thread holds the pool's lock (it does
    only if the call takes no lock)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    caller = threading.Thread(target=lambda: pool.deallocate(pool.allocate(64), 64))
    caller.start()
    caller.join(timeout=0.2)
    returned = not caller.is_alive()
    release.set()
    holder.join()
    caller.join()
    return returned


@pytest.mark.parametrize("thread_safe", [False, True])
def test_stopping_the_history_restores_the_pools_exact_behaviour(thread_safe: bool) -> None:
    pool = Pool(VirtualMemory(), thread_safe=thread_safe)
    assert _allocates_while_the_lock_is_held(pool) is not thread_safe
    history = record_memory_history(resource=pool, stacks=None)
    assert history is not None
    assert _allocates_while_the_lock_is_held(pool) is not thread_safe  # recorded, same locking
    assert [action.action for action, _ in history.entries()][-3:] == [
        "alloc", "free_requested", "free_completed"]
    record_memory_history(False, resource=pool)
    recorded = len(history)
    assert _allocates_while_the_lock_is_held(pool) is not thread_safe
    assert len(history) == recorded  # no longer recorded


@pytest.mark.parametrize("thread_safe", [False, True])
def test_nothing_is_bound_on_a_pool_instance(thread_safe: bool) -> None:
    # A compiled (mypyc) Pool cannot have instance attributes shadowing its methods.
    pool = Pool(VirtualMemory(), thread_safe=thread_safe)
    assert not {"allocate", "deallocate"} & set(vars(pool))
    record_memory_history(resource=pool)
    assert not {"allocate", "deallocate"} & set(vars(pool))
    record_memory_history(False, resource=pool)
    assert not {"allocate", "deallocate"} & set(vars(pool))


def test_a_bound_method_taken_before_recording_is_recorded() -> None:
    pool = Pool(HostMemory(), thread_safe=False)
    allocate, deallocate = pool.allocate, pool.deallocate  # a layer above keeps these
    history = record_memory_history(resource=pool, stacks=None)
    assert history is not None
    deallocate(allocate(1000), 1000)
    assert [action.action for action, _ in history.entries()] == [
        "alloc", "free_requested", "free_completed"]
    record_memory_history(False, resource=pool)
    deallocate(allocate(1000), 1000)
    assert len(history) == 3


def test_a_layer_that_is_not_a_pool_is_recorded_and_restored() -> None:
    tracking = ta.Tracking(HostMemory())  # keeps live_blocks(): each block its own segment
    history = record_memory_history(resource=tracking, stacks=None)
    assert history is not None
    tracking.deallocate(tracking.allocate(100), 100)
    assert [action.action for action, _ in history.entries()] == [
        "segment_alloc", "alloc", "free_requested", "free_completed", "segment_free"]
    record_memory_history(False, resource=tracking)
    assert not {"allocate", "deallocate"} & set(vars(tracking))
    tracking.deallocate(tracking.allocate(100), 100)
    assert len(history) == 5


def test_threads_frees_are_recorded_before_the_address_is_reused() -> None:
    pool = Pool(HostMemory())
    history = record_memory_history(resource=pool, max_entries=1_000_000, stacks=None)
    assert history is not None

    def work() -> None:
        for _ in range(2000):
            pool.deallocate(pool.allocate(256), 256)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    live: set[int] = set()
    for action, _ in history.entries():
        if action.action == "alloc":
            assert action.address not in live, "an address allocated twice before its free"
            live.add(action.address)
        elif action.action == "free_completed":
            live.remove(action.address)
    assert not live
    record_memory_history(False, resource=pool)


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [("enabled", "state", "enabled"), ("max_entries", 0, "max_entries"),
     ("stacks", "cpp", "stacks"), ("stack_depth", -1, "stack_depth")],
)
def test_bad_options_change_nothing(option: str, value: object, match: str) -> None:
    pool = Pool(VirtualMemory())
    with pytest.raises(InvalidArgumentError, match=match):
        record_memory_history(resource=pool, **{option: value})  # type: ignore[arg-type]
    assert memory_history(pool) is None and "allocate" not in vars(pool)


def test_a_resource_class_is_refused_and_left_unpatched() -> None:
    # Recording HostMemory (the class) once patched HostMemory.allocate for every instance.
    with pytest.raises(ta.InvalidResourceError, match="call it"):
        record_memory_history(resource=HostMemory)
    assert "allocate" not in vars(HostMemory) or vars(HostMemory)["allocate"].__qualname__ == (
        "HostMemory.allocate")
    memory = HostMemory()
    memory.deallocate(memory.allocate(4096), 4096)


def test_a_snapshot_written_over_a_folder_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    pool = Pool(VirtualMemory())
    with pytest.raises(IsADirectoryError, match="over a directory"):
        ta.dump_snapshot(tmp_path, resource=pool)
    assert list(tmp_path.iterdir()) == []


def test_dump_snapshot_opens_in_pytorchs_viewer_code(tmp_path: Path) -> None:
    viz = pytest.importorskip("torch.cuda._memory_viz")
    pool = Pool(HostMemory(), initial_size="1MiB")
    record_memory_history(resource=pool, stack_depth=4)
    blocks = [pool.allocate(n) for n in (100, 5000, 300_000, 2 << 20)]
    for address, nbytes in zip(blocks[::2], (100, 300_000), strict=True):
        pool.deallocate(address, nbytes)
    pool.trim()
    ta.dump_snapshot(tmp_path / "memory.pickle", resource=pool)
    record_memory_history(False, resource=pool)
    data = pickle.loads((tmp_path / "memory.pickle").read_bytes())
    assert (tmp_path / "memory.pickle").read_bytes()[:2] == b"\x80\x04"
    assert "total_reserved" in viz.segsum(data)  # every segment's blocks add up
    assert f"{len(data['device_traces'][0])} entries" in viz.trace(data)
    for html in (viz.trace_plot(data), viz.segment_plot(data)):
        assert "snapshot.pickle" in html
    flame = viz.memory(data, format_flamegraph=lambda text: text)
    assert "test_history.py" in flame  # the blocks' frames made it into the snapshot
    viz.segments(data, format_flamegraph=lambda text: text)


def test_our_history_reads_back_as_the_same_trace(tmp_path: Path) -> None:
    from tensorarena.trace import read_trace

    pool = Pool(HostMemory())
    record_memory_history(resource=pool)
    sizes = [100, 2000, 30_000]
    addresses = [pool.allocate(n) for n in sizes]
    pool.deallocate(addresses[1], 2000)
    ta.dump_snapshot(tmp_path / "s.pickle", resource=pool)
    record_memory_history(False, resource=pool)
    trace = read_trace(tmp_path / "s.pickle")
    assert [(e.op, e.nbytes) for e in trace] == [("a", 100), ("a", 2000), ("a", 30_000),
                                                 ("f", 2000)]
