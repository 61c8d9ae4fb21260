"""Guarded adaptor: canary red zones catch overflows and underflows; guard pages stop the
process at the faulting write."""

from __future__ import annotations

import ctypes
import random
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorarena as ta
from _source import line_of
from _upstreams import BufferMemory
from tensorarena.adaptors import Guarded, GuardedStatistics
from tensorarena.errors import (
    BufferOverflowError,
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    MemoryCorruptionError,
    NotHostAccessibleError,
    SizeMismatchError,
)
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.virtual import VirtualMemory

HERE = __file__.rsplit("/", 1)[-1]




def _poke(address: int, value: int = 0) -> None:
    ctypes.memset(address, value, 1)


@pytest.mark.parametrize("alignment", [1, 8, 256, 4096])
@pytest.mark.parametrize("nbytes", [1, 7, 100, 4097])
def test_one_byte_past_the_end_is_caught_on_free(alignment: int, nbytes: int) -> None:
    pool = Pool(HostMemory())
    guarded = Guarded(pool)
    address = guarded.allocate(nbytes, alignment)  # ALLOCATED HERE
    assert address % alignment == 0
    ctypes.memset(address, 0x11, nbytes)  # the whole block is the user's: no false alarm
    _poke(address + nbytes)
    with pytest.raises(BufferOverflowError) as caught:
        guarded.deallocate(address, nbytes)
    error = caught.value
    assert isinstance(error, MemoryCorruptionError) and isinstance(error, ta.TensorArenaError)
    assert (error.side, error.offset, error.corrupted) == ("overflow", nbytes, 1)
    assert (error.address, error.nbytes, error.pattern) == (address, nbytes, 0xFD)
    assert f"{HERE}:{line_of(__file__, '# ALLOCATED HERE')} in test_one_byte_past" in str(error)
    assert "1 byte(s) past its end" in str(error)
    assert guarded.live_blocks() == {address: nbytes} and len(pool) == 1  # nothing changed
    guarded.deallocate(address, nbytes)  # reported once: the canary was written back
    assert guarded.live_blocks() == {} and len(pool) == 0


@pytest.mark.parametrize("alignment", [1, 256, 65536])
def test_one_byte_before_the_start_is_an_underflow(alignment: int) -> None:
    guarded = Guarded(Pool(HostMemory()))
    address = guarded.allocate(50, alignment)
    _poke(address - 1)
    with pytest.raises(BufferOverflowError) as caught:
        guarded.deallocate(address, 50)
    assert (caught.value.side, caught.value.offset) == ("underflow", -1)
    assert "1 byte(s) before its start" in str(caught.value)
    guarded.deallocate(address, 50)


def test_check_finds_a_corrupted_live_block_and_names_the_first_offset() -> None:
    guarded = Guarded(Pool(HostMemory()), redzone=32, stack_depth=3)
    blocks = [guarded.allocate(n) for n in (10, 20, 30)]
    assert guarded.check() == 3
    ctypes.memset(blocks[1] + 20 + 5, 0, 4)  # bytes 5..8 past the end, not the first ones
    with pytest.raises(BufferOverflowError) as caught:
        guarded.check()
    error = caught.value
    assert (error.address, error.offset, error.corrupted) == (blocks[1], 25, 4)
    assert error.site.count("\n") == 2  # three frames
    assert guarded.check(blocks[1]) == 1  # reported once: the zone was re-armed
    ctypes.memset(blocks[0] - 3, 0, 1)
    with pytest.raises(BufferOverflowError, match="underflow"):
        guarded.check(blocks[0])
    assert guarded.check() == 3
    stats = guarded.statistics()
    assert isinstance(stats, GuardedStatistics)
    assert stats.live_blocks == 3 and stats.live_bytes == 60 and stats.corruptions == 2
    assert [e.offset for e in guarded.corruptions] == [25, -3]
    assert stats.guard_bytes == 3 * (256 + 32)  # front zone rounded to the alignment, back 32


def test_planted_overflows_and_underflows_are_caught_every_time() -> None:
    rng = random.Random(7)
    guarded = Guarded(Pool(HostMemory()), redzone=16)
    for _ in range(300):
        nbytes = rng.randrange(1, 3000)
        alignment = rng.choice([1, 16, 256])
        address = guarded.allocate(nbytes, alignment)
        distance = rng.randrange(0, 16)
        if rng.random() < 0.5:
            _poke(address + nbytes + distance, rng.randrange(0, 0xFD))
            side, offset = "overflow", nbytes + distance
        else:
            _poke(address - 1 - distance, rng.randrange(0, 0xFD))
            side, offset = "underflow", -1 - distance
        with pytest.raises(BufferOverflowError) as caught:
            guarded.deallocate(address, nbytes)
        assert (caught.value.side, caught.value.offset) == (side, offset)
        guarded.deallocate(address, nbytes)
    assert guarded.statistics().corruptions == 300 and guarded.live_blocks() == {}


def test_an_overflowing_numpy_array_is_caught_by_check() -> None:
    guarded = Guarded(Pool(HostMemory()))
    array = ta.empty(10, np.int32, resource=guarded)
    wider = np.ndarray((11,), np.int32, buffer=(ctypes.c_char * 44).from_address(
        array.ctypes.data))  # an off-by-one loop bound, as C code would have it
    wider[:] = 1
    with pytest.raises(BufferOverflowError) as caught:
        guarded.check()
    assert (caught.value.side, caught.value.offset, caught.value.corrupted) == ("overflow", 40, 4)
    del wider, array
    assert guarded.live_blocks() == {}


def test_an_overflow_found_in_an_arrays_finalizer_is_kept_not_lost() -> None:
    """The free of an array runs in a finalizer, where an error can only be printed: it is
    kept in .corruptions, and the block stays live (listed as outstanding by a tracker)."""
    guarded = Guarded(Pool(HostMemory()))
    array = ta.empty(10, np.int32, resource=guarded)
    address = array.ctypes.data
    _poke(address + 40)
    unraisable: list[BaseException | None] = []
    previous, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(u.exc_value)
    try:
        del array
    finally:
        sys.unraisablehook = previous
    assert len(unraisable) == 1 and isinstance(unraisable[0], BufferOverflowError)
    assert guarded.corruptions == unraisable
    assert guarded.live_blocks() == {address: 40}
    guarded.deallocate(address, 40)


def test_bad_frees_are_refused_before_anything_changes() -> None:
    guarded = Guarded(BufferMemory())
    address = guarded.allocate(100)
    freed = guarded.allocate(10)
    guarded.deallocate(freed, 10)
    before = (guarded.statistics(), guarded.live_blocks())
    with pytest.raises(DoubleFreeError, match="Guarded: double free"):
        guarded.deallocate(freed, 10)
    with pytest.raises(SizeMismatchError):
        guarded.deallocate(address, 101)
    with pytest.raises(InvalidAddressError, match="not a live block"):
        guarded.deallocate(address - 64, 164)  # the upstream block's start is not the user's
    assert (guarded.statistics(), guarded.live_blocks()) == before
    guarded.deallocate(address, 100)


def test_options_are_checked() -> None:
    with pytest.raises(NotHostAccessibleError):
        Guarded(VirtualMemory())
    with pytest.raises(NotHostAccessibleError):
        Guarded(Pool(VirtualMemory()))
    with pytest.raises(ta.InvalidSizeError):
        Guarded(BufferMemory(), redzone=0)
    with pytest.raises(InvalidArgumentError, match="pattern"):
        Guarded(BufferMemory(), pattern=256)
    with pytest.raises(InvalidArgumentError, match="guard_pages"):
        Guarded(BufferMemory(), guard_pages=1)  # type: ignore[arg-type]


def test_guard_page_mode_checks_the_alignment_slack_like_a_red_zone() -> None:
    guarded = Guarded(Pool(HostMemory()), guard_pages=True)
    address = guarded.allocate(100)  # 256-aligned: up to 255 bytes between end and page
    _poke(address + 100)
    with pytest.raises(BufferOverflowError) as caught:
        guarded.deallocate(address, 100)
    assert caught.value.offset == 100
    exact = guarded.allocate(4096, 4096)  # ends exactly at the guard page
    ctypes.memset(exact, 1, 4096)
    guarded.deallocate(exact, 4096)


_FAULT_SCRIPT = """
import ctypes, faulthandler, sys
import tensorarena as ta
faulthandler.enable()
guarded = ta.Guarded(ta.Pool(ta.HostMemory()), guard_pages={pages})
address = guarded.allocate(1000, alignment=8)
ctypes.memset(address, 1, 1000)
print("in bounds ok", flush=True)
ctypes.memset(address + 1000, 2, 1)
print("wrote past the end", flush=True)
guarded.deallocate(address, 1000)
"""


def _fault(pages: bool) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(_FAULT_SCRIPT).format(pages=pages)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="guard pages need mprotect")
def test_a_guard_page_stops_the_process_at_the_faulting_write() -> None:
    result = _fault(True)
    assert result.returncode == -signal.SIGSEGV, result
    assert result.stdout == "in bounds ok\n"  # stopped at the write, not later
    assert "Segmentation fault" in result.stderr
    assert 'File "<string>", line 9' in result.stderr  # faulthandler names the writing line


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="guard pages need mprotect")
def test_without_guard_pages_the_same_write_is_found_only_at_the_free() -> None:
    result = _fault(False)
    assert result.returncode == 1
    assert result.stdout == "in bounds ok\nwrote past the end\n"
    assert "BufferOverflowError: buffer overflow" in result.stderr
