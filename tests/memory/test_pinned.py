"""PinnedHostMemory: pages really locked (VmLck), the limit checked first, pluggable backends.

The VmLck and RLIMIT_MEMLOCK checks are the mlock backend's, so those tests ask for it by name:
where CUDA is present, the default ("auto") pins through the driver instead.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import resource as rlimit
from pathlib import Path

import pytest

from tensorarena.errors import DoubleFreeError, OutOfMemoryError, SizeMismatchError
from tensorarena.memory.host import PAGE_SIZE, map_region, unmap_region
from tensorarena.memory.pinned import (
    MlockBackend,
    PinnedHostMemory,
    UnknownNameError,
    locked_bytes,
    memlock_limit,
)

MiB = 1 << 20


def _vmlck() -> int:
    value = locked_bytes()
    assert value is not None, "VmLck missing from /proc/self/status"
    return value


def _room_to_lock() -> int | None:
    limit = memlock_limit()
    return None if limit is None else limit - _vmlck()


def test_memlock_limit_reports_the_soft_rlimit() -> None:
    soft, _ = rlimit.getrlimit(rlimit.RLIMIT_MEMLOCK)
    expected = None if soft == rlimit.RLIM_INFINITY else soft
    assert memlock_limit() == expected
    assert PinnedHostMemory("mlock").limit == expected
    assert PinnedHostMemory("mlock", limit="3MiB").limit == 3 * MiB


def test_pinned_pages_show_up_in_vmlck_and_leave_with_the_block() -> None:
    room = _room_to_lock()
    if room is not None and room < 2 * MiB:
        pytest.skip(f"RLIMIT_MEMLOCK leaves only {room} bytes lockable (need 2 MiB)")
    pinned = PinnedHostMemory("mlock")
    before = _vmlck()
    address = pinned.allocate(MiB + 1)  # rounded up to whole pages
    length = MiB + PAGE_SIZE
    assert _vmlck() - before == length
    assert pinned.pinned == length
    ctypes.memset(address, 0x42, MiB + 1)
    assert ctypes.string_at(address, 16) == b"\x42" * 16
    pinned.deallocate(address, MiB + 1)
    assert _vmlck() == before
    assert pinned.pinned == 0 and pinned.live_blocks() == {}


def test_a_request_over_the_limit_fails_before_locking_anything() -> None:
    pinned = PinnedHostMemory("mlock", limit=_vmlck() + MiB)
    keep = pinned.allocate(512 * 1024)
    before_stats, before_locked = pinned.statistics(), _vmlck()
    with pytest.raises(OutOfMemoryError) as error:
        pinned.allocate(MiB)
    assert error.value.limit == pinned.limit
    assert error.value.allocated == before_locked
    assert "RLIMIT_MEMLOCK" in str(error.value) and "ulimit -l" in str(error.value)
    assert "over the limit" in str(error.value)
    assert pinned.statistics() == dataclasses.replace(before_stats, num_ooms=1)
    assert _vmlck() == before_locked
    pinned.deallocate(keep, 512 * 1024)


def test_the_rlimit_is_the_default_cap() -> None:
    limit = memlock_limit()
    if limit is None:
        pytest.skip("RLIMIT_MEMLOCK is unlimited here: nothing to exceed")
    pinned = PinnedHostMemory("mlock")
    with pytest.raises(OutOfMemoryError) as error:
        pinned.allocate(limit + PAGE_SIZE)
    assert error.value.limit == limit
    assert pinned.statistics().allocations.total == 0


class RecordingBackend:
    """A pinning backend that maps but does not lock, recording what it was asked."""

    name = "recording"

    def __init__(self, limit: int | None = None, fail: bool = False) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self._limit = limit
        self._fail = fail
        self._pinned = 0

    def pin(self, length: int, alignment: int) -> int:
        if self._fail:
            raise OSError(errno.ENOMEM, "cannot allocate memory")
        address = map_region(length, alignment)
        self.calls.append(("pin", address, length))
        self._pinned += length
        return address

    def unpin(self, address: int, length: int) -> None:
        self.calls.append(("unpin", address, length))
        self._pinned -= length
        unmap_region(address, length)

    def limit(self) -> int | None:
        return self._limit

    def pinned(self) -> int | None:
        return self._pinned


def test_backends_are_pluggable() -> None:
    backend = RecordingBackend()
    pinned = PinnedHostMemory(backend)
    assert pinned.backend is backend and pinned.limit is None
    address = pinned.allocate(100, alignment=65536)
    assert address % 65536 == 0
    pinned.deallocate(address, 100)
    assert backend.calls == [("pin", address, PAGE_SIZE), ("unpin", address, PAGE_SIZE)]
    assert "backend=recording" in repr(pinned)


def test_the_backend_limit_counts_what_the_backend_reports_pinned() -> None:
    backend = RecordingBackend(limit=3 * PAGE_SIZE)
    pinned = PinnedHostMemory(backend)
    first = pinned.allocate(2 * PAGE_SIZE)
    with pytest.raises(OutOfMemoryError) as error:
        pinned.allocate(2 * PAGE_SIZE)
    assert error.value.free == PAGE_SIZE and error.value.limit == 3 * PAGE_SIZE
    assert len(backend.calls) == 1, "the backend must not be asked once the limit says no"
    second = pinned.allocate(PAGE_SIZE)
    pinned.deallocate(first, 2 * PAGE_SIZE)
    pinned.deallocate(second, PAGE_SIZE)


def test_a_failing_backend_is_out_of_memory_and_changes_nothing() -> None:
    pinned = PinnedHostMemory(RecordingBackend(fail=True))
    before = pinned.statistics()
    with pytest.raises(OutOfMemoryError, match="could not pin"):
        pinned.allocate(PAGE_SIZE)
    assert pinned.statistics() == dataclasses.replace(before, num_ooms=1)


def test_unknown_backend_names_are_refused() -> None:
    with pytest.raises(UnknownNameError, match="cuda-ish"):
        PinnedHostMemory("cuda-ish")  # type: ignore[arg-type]
    assert isinstance(PinnedHostMemory("mlock").backend, MlockBackend)


def test_bad_frees_keep_the_pages_locked() -> None:
    room = _room_to_lock()
    if room is not None and room < MiB:
        pytest.skip(f"RLIMIT_MEMLOCK leaves only {room} bytes lockable (need 1 MiB)")
    pinned = PinnedHostMemory("mlock")
    address = pinned.allocate(8192)
    locked = _vmlck()
    with pytest.raises(SizeMismatchError):
        pinned.deallocate(address, 4096)
    assert _vmlck() == locked
    pinned.deallocate(address, 8192)
    with pytest.raises(DoubleFreeError):
        pinned.deallocate(address, 8192)
    assert _vmlck() == locked - 8192


def test_vmlck_is_what_proc_says() -> None:
    text = Path("/proc/self/status").read_text()
    line = next(line for line in text.splitlines() if line.startswith("VmLck:"))
    assert locked_bytes() == int(line.split()[1]) * 1024
