"""Tracking adaptor: live allocations with their sites, leak reports, explained out-of-memory."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tensorarena as ta
from _source import line_of
from _upstreams import BufferMemory
from tensorarena.adaptors import Limiting, Tracking
from tensorarena.errors import (
    DoubleFreeError,
    InvalidArgumentError,
    OutOfMemoryError,
)
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool

HERE = __file__.rsplit("/", 1)[-1]




def _leaky(tracker: Tracking, nbytes: int) -> int:
    return tracker.allocate(nbytes)  # LEAK SITE


def test_outstanding_lists_live_allocations_oldest_first_with_their_site() -> None:
    tracker = Tracking(BufferMemory(), stack_depth=3)
    first = _leaky(tracker, 100)
    second = _leaky(tracker, 200)
    third = tracker.allocate(300)
    tracker.deallocate(second, 200)
    items = tracker.outstanding()
    assert [(i.address, i.nbytes, i.sequence) for i in items] == [(first, 100, 0), (third, 300, 2)]
    assert items[0].site == f"{_short(__file__)}:{line_of(__file__, '# LEAK SITE')} in _leaky"
    assert items[0].stack[1][2].startswith("test_outstanding_lists_live_allocations")
    assert len(items[0].stack) == 3 and items[1].stack[0][2].startswith("test_outstanding")
    assert tracker.live_blocks() == {first: 100, third: 300}
    assert tracker.live_bytes == 400 and len(tracker) == 2
    assert tracker.stack_of(first) == items[0].stack and tracker.stack_of(second) is None
    tracker.deallocate(first, 100)
    tracker.deallocate(third, 300)
    assert tracker.outstanding() == ()


def _short(path: str) -> str:
    import os

    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def test_report_groups_by_site_largest_first() -> None:
    tracker = Tracking(BufferMemory(), stack_depth=2)
    for _ in range(3):
        _leaky(tracker, 1000)
    tracker.allocate(5000)  # ONE BIG
    report = tracker.report()
    assert report and report.blocks == 4 and report.nbytes == 8000
    assert [(s.blocks, s.nbytes) for s in report.sites] == [(1, 5000), (3, 3000)]
    assert report.sites[0].site.endswith(f":{line_of(__file__, '# ONE BIG')} in "
                                         "test_report_groups_by_site_largest_first")
    text = str(report)
    assert "4 outstanding allocation(s)" in text and "from 2 site(s)" in text
    assert f"{HERE}:{line_of(__file__, '# LEAK SITE')} in _leaky" in text
    assert text.index("4.88 KiB") < text.index("2.93 KiB")  # most bytes first


def test_a_clean_program_reports_nothing() -> None:
    tracker = Tracking(Pool(HostMemory()), stack_depth=4)
    rng = np.random.default_rng(0)
    live: list[tuple[int, int]] = []
    for _ in range(2000):
        if live and rng.random() < 0.5:
            tracker.deallocate(*live.pop(int(rng.integers(len(live)))))
        else:
            nbytes = int(rng.integers(1, 20000))
            live.append((tracker.allocate(nbytes), nbytes))
    for address, nbytes in live:
        tracker.deallocate(address, nbytes)
    report = tracker.report()
    assert not report and report.blocks == 0 and report.sites == ()
    assert str(report) == "no outstanding allocations"


def test_a_leaked_array_is_reported_at_the_line_that_made_it() -> None:
    tracker = Tracking(Pool(HostMemory()), stack_depth=2)
    kept = []
    for _ in range(3):
        kept.append(ta.empty((16, 16), np.float32, resource=tracker))  # ARRAY LEAK
        temporary = ta.empty(100, np.float64, resource=tracker)
        del temporary
    report = tracker.report()
    assert report.blocks == 3 and report.nbytes == 3 * 1024
    name = "test_a_leaked_array_is_reported_at_the_line_that_made_it"
    assert report.sites[0].site.endswith(f":{line_of(__file__, '# ARRAY LEAK')} in {name}")
    kept.clear()
    assert not tracker.report()


def test_mark_restricts_the_report_to_later_allocations() -> None:
    tracker = Tracking(BufferMemory(), stack_depth=1)
    before = tracker.allocate(64)
    mark = tracker.mark()
    step = tracker.allocate(128)
    assert [i.address for i in tracker.outstanding(since=mark)] == [step]
    assert tracker.report(since=mark).nbytes == 128
    assert tracker.report().nbytes == 192
    tracker.deallocate(step, 128)
    assert not tracker.report(since=mark)
    tracker.deallocate(before, 64)


def test_a_mark_is_above_every_allocation_numbered_before_it() -> None:
    """Two threads allocating at once: the second numbered and recorded its block between the
    first's taking a number and its writing "next = number + 1", so the first wrote next back
    down and mark() came out one too low, listing an earlier block as later. The interleaving
    is forced here by a counter whose first number lets the other allocation run."""
    tracker = Tracking(BufferMemory())
    counter = itertools.count()
    other: list[int] = []

    class Interleaved:
        def __iter__(self) -> Interleaved:
            return self

        def __next__(self) -> int:
            number = next(counter)
            if number == 0:
                other.append(tracker.allocate(32))  # the other thread, all the way through
            return number

    tracker._sequence = Interleaved()  # type: ignore[assignment]
    first = tracker.allocate(64)
    before = tracker.outstanding()
    assert sorted(i.sequence for i in before) == [0, 1]
    mark = tracker.mark()
    assert all(i.sequence < mark for i in before)
    assert tracker.outstanding(since=mark) == ()
    later = tracker.allocate(16)
    assert [i.address for i in tracker.outstanding(since=mark)] == [later]
    for address, nbytes in ((first, 64), (other[0], 32), (later, 16)):
        tracker.deallocate(address, nbytes)


def test_without_stacks_the_report_groups_by_size_and_says_how_to_get_sites() -> None:
    tracker = Tracking(BufferMemory())
    assert tracker.stack_depth == 0
    for nbytes in (64, 64, 4096):
        tracker.allocate(nbytes)
    report = tracker.report()
    assert [(s.size, s.blocks) for s in report.sites] == [(4096, 1), (64, 2)]
    assert "<64 bytes each, site unknown>" in str(report)
    assert "stack_depth=8" in str(report)
    assert tracker.outstanding()[0].stack == ()


def test_a_failed_free_leaves_the_allocation_tracked() -> None:
    upstream = BufferMemory()
    tracker = Tracking(upstream)
    address = tracker.allocate(100)
    with pytest.raises(ta.SizeMismatchError):
        tracker.deallocate(address, 99)
    assert tracker.live_blocks() == {address: 100}
    tracker.deallocate(np.int64(address), 100)
    with pytest.raises(DoubleFreeError):
        tracker.deallocate(address, 100)
    assert tracker.live_blocks() == {}


@pytest.mark.parametrize("depth", [-1, 65, 1.0, "4", True])
def test_bad_options_are_refused(depth: object) -> None:
    with pytest.raises(InvalidArgumentError, match="stack_depth"):
        Tracking(BufferMemory(), stack_depth=depth)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="report_at_exit"):
        Tracking(BufferMemory(), report_at_exit=1)  # type: ignore[arg-type]
    with pytest.raises(ta.InvalidResourceError):
        Tracking(Pool)  # type: ignore[arg-type]


def test_threads_sharing_a_tracker_lose_nothing() -> None:
    tracker = Tracking(Pool(HostMemory()), stack_depth=1)
    kept: list[list[tuple[int, int]]] = [[] for _ in range(4)]

    def work(index: int) -> None:
        for step in range(2000):
            nbytes = 64 + step % 7 * 32
            address = tracker.allocate(nbytes)
            if step % 3:
                tracker.deallocate(address, nbytes)
            else:
                kept[index].append((address, nbytes))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = {address: nbytes for chunk in kept for address, nbytes in chunk}
    assert tracker.live_blocks() == expected
    for address, nbytes in expected.items():
        tracker.deallocate(address, nbytes)
    assert not tracker.report()


# --- out of memory -------------------------------------------------------------------------


def test_an_oom_lists_the_top_sites_reserved_allocated_and_fragmentation() -> None:
    pool = Pool(HostMemory(), initial_size="1MiB", maximum_size="1MiB")
    tracker = Tracking(pool, stack_depth=2)
    blocks = [tracker.allocate(100_000) for _ in range(8)]  # OOM SITE
    for address in blocks[::2]:
        tracker.deallocate(address, 100_000)
    with pytest.raises(OutOfMemoryError) as caught:
        tracker.allocate(300_000)
    error = caught.value
    assert error.is_fragmentation and error.requested == 300_000  # numbers and class kept
    text = str(error)
    assert "4 outstanding allocation(s)" in text
    assert f"{HERE}:{line_of(__file__, '# OOM SITE')}" in text
    stats = pool.statistics()
    assert "Pool below: reserved 1 MiB, allocated 391 KiB" in text
    assert f"fragmentation {stats.fragmentation:.1%}" in text and stats.fragmentation > 0.5
    assert pool.statistics() == stats  # explaining changed nothing


def test_an_oom_from_a_limit_is_explained_once_through_nested_trackers() -> None:
    tracker = Tracking(Tracking(Limiting(Pool(HostMemory()), "1MiB"), stack_depth=1))
    tracker.allocate("900KiB")
    with pytest.raises(OutOfMemoryError) as caught:
        tracker.allocate("200KiB")
    text = str(caught.value)
    assert caught.value.limit == 1 << 20 and "over the limit of 1 MiB" in text
    assert text.count("outstanding allocation(s)") == 1
    assert "Pool below: reserved" in text


def test_memory_summary_descends_through_a_tracker() -> None:
    tracker = Tracking(Pool(HostMemory()))
    address = tracker.allocate(1000)
    assert "Requested bytes" in ta.memory_summary(tracker)
    assert ta.memory_stats(tracker)["requested_bytes.all.current"] == 1000
    tracker.deallocate(address, 1000)


# --- at exit -------------------------------------------------------------------------------

_EXIT_SCRIPT = """
import numpy as np
import tensorarena as ta
tracker = ta.Tracking(ta.Pool(ta.HostMemory()), stack_depth=2, report_at_exit=True)
def load():
    return ta.empty(1000, np.uint8, resource=tracker)
kept = load()
dropped = load()
del dropped
{extra}
"""


def _run(extra: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(_EXIT_SCRIPT).format(extra=extra)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )


def test_report_at_exit_warns_about_leaks_with_their_site() -> None:
    result = _run("")
    assert "LeakWarning" in result.stderr
    assert "1 outstanding allocation(s), 1000 B" in result.stderr
    assert "<string>:6 in load" in result.stderr and "<string>:7 in <module>" in result.stderr


def test_report_at_exit_is_silent_for_a_clean_program() -> None:
    result = _run("del kept")
    assert result.stderr == ""
