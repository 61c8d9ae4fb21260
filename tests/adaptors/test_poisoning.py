"""Poisoning adaptor: a write after free is found with the site that freed the block; and the
debugging adaptors together raise nothing over a long clean run but catch every planted bug."""

from __future__ import annotations

import ctypes
import random
import re
import sys

import numpy as np
import pytest

import tensorarena as ta
from _source import line_of
from _upstreams import BufferMemory
from tensorarena.adaptors import Guarded, Poisoning, PoisoningStatistics, Tracking
from tensorarena.errors import (
    BufferOverflowError,
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    NotHostAccessibleError,
    SizeMismatchError,
    UseAfterFreeError,
)
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.virtual import VirtualMemory

HERE = __file__.rsplit("/", 1)[-1]




def test_a_write_after_free_is_reported_with_the_site_that_freed_it() -> None:
    poisoning = Poisoning(Pool(HostMemory()), stack_depth=2)
    address = poisoning.allocate(256)  # ALLOCATED
    ctypes.memset(address, 7, 256)
    poisoning.deallocate(address, 256)  # FREED
    assert ctypes.string_at(address, 256) == b"\xdd" * 256
    assert poisoning.check() == 1
    ctypes.memset(address + 100, 0, 3)
    with pytest.raises(UseAfterFreeError) as caught:
        poisoning.check()
    error = caught.value
    assert (error.address, error.nbytes, error.offset, error.corrupted) == (address, 256, 100, 3)
    name = "test_a_write_after_free_is_reported_with_the_site_that_freed_it"
    assert re.search(rf"freed at \S*{HERE}:{line_of(__file__, '# FREED')} in {name}", str(error))
    allocated = line_of(__file__, "# ALLOCATED")
    assert re.search(rf"allocated at \S*{HERE}:{allocated} in {name}", str(error))
    assert f"{HERE}:{line_of(__file__, '# FREED')}" in error.freed_at
    assert poisoning.corruptions == [error]
    assert poisoning.check() == 1  # reported once, then poisoned again


def test_the_write_is_found_when_the_block_leaves_quarantine() -> None:
    pool = Pool(HostMemory())
    poisoning = Poisoning(pool, quarantine="4KiB")
    victim = poisoning.allocate(1000)
    poisoning.deallocate(victim, 1000)
    ctypes.memset(victim, 0, 1)  # a stale pointer writes
    others = [poisoning.allocate(1000) for _ in range(4)]
    for address in others[:3]:
        poisoning.deallocate(address, 1000)  # 4000 bytes quarantined: within the bound
    with pytest.raises(UseAfterFreeError) as caught:
        poisoning.deallocate(others[3], 1000)  # over the bound: the victim would leave
    assert caught.value.address == victim and caught.value.offset == 0
    stats = poisoning.statistics()
    assert stats.quarantined_blocks == 4 and stats.live_blocks == 1  # nothing changed
    assert stats.corruptions == 1 and len(pool) == 5
    poisoning.deallocate(others[3], 1000)  # reported once: the victim was poisoned again
    assert len(pool) == 4 and poisoning.statistics().quarantined_blocks == 4
    assert poisoning.flush() == 4000 and len(pool) == 0


def test_flush_verifies_and_releases_everything() -> None:
    pool = Pool(HostMemory())
    poisoning = Poisoning(pool)
    blocks = [poisoning.allocate(n) for n in (10, 20, 30)]
    for address, nbytes in zip(blocks, (10, 20, 30), strict=True):
        poisoning.deallocate(address, nbytes)
    ctypes.memset(blocks[2] + 29, 1, 1)
    with pytest.raises(UseAfterFreeError) as caught:
        poisoning.flush()
    assert caught.value.offset == 29 and len(pool) == 3  # nothing released
    assert poisoning.flush() == 60
    assert len(pool) == 0 and poisoning.statistics().quarantined_bytes == 0
    pool.reset()  # nothing waits in quarantine any more


def test_a_freed_array_written_through_a_kept_pointer_is_caught() -> None:
    poisoning = Poisoning(Pool(HostMemory()), stack_depth=3)
    array = ta.empty(64, np.float32, resource=poisoning)
    address = array.ctypes.data
    array[:] = 1.0
    del array  # ARRAY FREED
    ctypes.c_float.from_address(address + 8).value = 2.0  # a stale pointer writes
    with pytest.raises(UseAfterFreeError) as caught:
        poisoning.check()
    assert caught.value.offset == 8 and caught.value.corrupted == 4
    assert f"{HERE}:{line_of(__file__, '# ARRAY FREED')}" in caught.value.freed_at


def test_double_free_names_where_it_was_freed_and_bad_frees_change_nothing() -> None:
    poisoning = Poisoning(BufferMemory())
    address = poisoning.allocate(64)
    other = poisoning.allocate(32)
    poisoning.deallocate(address, 64)  # FIRST FREE
    before = (poisoning.statistics(), poisoning.live_blocks())
    first = line_of(__file__, "# FIRST")
    with pytest.raises(DoubleFreeError, match=rf"already freed at \S*{HERE}:{first}"):
        poisoning.deallocate(address, 64)
    with pytest.raises(SizeMismatchError):
        poisoning.deallocate(other, 33)
    with pytest.raises(InvalidAddressError):
        poisoning.deallocate(other + 1, 32)
    assert (poisoning.statistics(), poisoning.live_blocks()) == before
    poisoning.deallocate(other, 32)


def test_a_full_quarantine_is_flushed_and_the_request_retried_at_oom() -> None:
    pool = Pool(HostMemory(), initial_size="1MiB", maximum_size="1MiB")
    poisoning = Poisoning(pool, quarantine="64MiB")
    halves = [poisoning.allocate("512KiB") for _ in range(2)]
    for address in halves:
        poisoning.deallocate(address, "512KiB")
    whole = poisoning.allocate("1MiB")  # only fits once the quarantine let go
    stats = poisoning.statistics()
    assert stats.num_alloc_retries == 1 and stats.quarantined_blocks == 0
    poisoning.deallocate(whole, "1MiB")
    poisoning.flush()
    with pytest.raises(ta.OutOfMemoryError):
        poisoning.allocate("2MiB")  # an empty quarantine: the error passes through


def test_fill_new_marks_fresh_blocks_and_bounds_hold() -> None:
    poisoning = Poisoning(BufferMemory(), fill_new=0xCD, quarantine=0, max_blocks=0)
    address = poisoning.allocate(100)
    assert ctypes.string_at(address, 100) == b"\xcd" * 100
    poisoning.deallocate(address, 100)
    assert poisoning.statistics() == PoisoningStatistics(
        live_blocks=0, quarantined_blocks=0, quarantined_bytes=0, blocks_verified=0,
        corruptions=0,
    )
    counted = Poisoning(BufferMemory(), max_blocks=2)
    for _ in range(5):
        counted.deallocate(counted.allocate(8), 8)
    assert counted.statistics().quarantined_blocks == 2


def test_options_are_checked() -> None:
    with pytest.raises(NotHostAccessibleError):
        Poisoning(VirtualMemory())
    with pytest.raises(InvalidArgumentError, match="fill_new"):
        Poisoning(BufferMemory(), fill_new=-1)
    with pytest.raises(InvalidArgumentError, match="max_blocks"):
        Poisoning(BufferMemory(), max_blocks=-1)
    with pytest.raises(ta.InvalidSizeError):
        Poisoning(BufferMemory(), quarantine="lots")


# --- the debugging adaptors together --------------------------------------------------------


def _stack(pool: Pool) -> tuple[Tracking, Guarded, Poisoning]:
    poisoning = Poisoning(pool, quarantine="256KiB", stack_depth=2)
    guarded = Guarded(poisoning, redzone=16, stack_depth=2)
    return Tracking(guarded, stack_depth=2), guarded, poisoning


def test_a_long_clean_run_reports_nothing() -> None:
    """Random sizes, alignments and lifetimes, every byte of every block written and read
    back: no check raises, and once everything is freed no leak is reported."""
    rng = random.Random(2024)
    pool = Pool(HostMemory())
    tracking, guarded, poisoning = _stack(pool)
    live: dict[int, tuple[int, int]] = {}
    for step in range(3000):
        if live and rng.random() < 0.48:
            address = rng.choice(list(live))
            nbytes, value = live.pop(address)
            assert ctypes.string_at(address, nbytes) == bytes([value]) * nbytes
            tracking.deallocate(address, nbytes)
        else:
            nbytes = rng.choice([1, 3, 64, 255, 1000, 4096, 20_000])
            address = tracking.allocate(nbytes, rng.choice([1, 8, 256, 4096]))
            value = step % 255
            ctypes.memset(address, value, nbytes)
            live[address] = (nbytes, value)
        if step % 500 == 0:
            guarded.check()
            poisoning.check()
    for address, (nbytes, _) in live.items():
        tracking.deallocate(address, nbytes)
    poisoning.flush()
    assert not tracking.report()
    assert guarded.corruptions == [] and poisoning.corruptions == []
    assert len(pool) == 0


def test_planted_bugs_in_a_random_run_are_caught_every_time() -> None:
    rng = random.Random(99)
    tracking, _, poisoning = _stack(Pool(HostMemory()))
    caught = {"overflow": 0, "underflow": 0, "use after free": 0}
    planted = dict.fromkeys(caught, 0)
    for _ in range(150):
        nbytes = rng.randrange(1, 5000)
        address = tracking.allocate(nbytes, rng.choice([1, 64, 256]))
        bug = rng.choice(list(planted))
        planted[bug] += 1
        if bug == "overflow":
            ctypes.memset(address + nbytes + rng.randrange(16), 0, 1)
        elif bug == "underflow":
            ctypes.memset(address - 1 - rng.randrange(16), 0, 1)
        try:
            tracking.deallocate(address, nbytes)
        except BufferOverflowError as error:
            caught[error.side] += 1
            tracking.deallocate(address, nbytes)  # reported once, then it frees
        if bug == "use after free":
            ctypes.memset(address + rng.randrange(nbytes), 0x42, 1)
            try:
                poisoning.check()
            except UseAfterFreeError:
                caught[bug] += 1
    assert caught == planted
    assert not tracking.report()


def test_a_leaked_array_among_clean_ones_is_the_only_report() -> None:
    tracking, _, poisoning = _stack(Pool(HostMemory()))
    kept = []
    for step in range(200):
        array = ta.zeros((step % 13 + 1, 7), np.float64, resource=tracking)
        if step == 123:
            kept.append(array)  # THE LEAK
        del array
    report = tracking.report()
    assert report.blocks == 1 and len(report.sites) == 1
    assert report.sites[0].stack[0][1] == line_of(__file__, "ta.zeros((step % 13")
    kept.clear()
    poisoning.check()
    assert not tracking.report()


def test_no_output_and_nothing_left_after_a_clean_array_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tracking, guarded, poisoning = _stack(Pool(HostMemory()))
    unraisable: list[object] = []
    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        for step in range(300):
            array = ta.empty(step + 1, np.uint8, resource=tracking)
            array[:] = step % 256
            del array
    finally:
        sys.unraisablehook = previous
    poisoning.flush()
    assert unraisable == [] and capsys.readouterr() == ("", "")
    assert guarded.statistics().corruptions == 0 and not tracking.report()
