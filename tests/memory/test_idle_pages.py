"""Idle pages given back (:mod:`tensorarena.memory.idle_pages`): on real mappings, only whole
pages of private anonymous memory go, the rest of the range keeps its bytes, and anything else
(shared, file-backed, locked, not mapped) gives back nothing and loses nothing."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np
import pytest

from tensorarena.errors import InvalidArgumentError
from tensorarena.memory import libc
from tensorarena.memory.idle_pages import PAGE, private_anonymous, release_idle_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="/proc/self/maps and madvise: Linux")


@pytest.fixture
def mapped() -> object:
    """Four pages of private anonymous memory, every byte 0xAB."""
    address = libc.mmap_anonymous(4 * PAGE)
    ctypes.memset(address, 0xAB, 4 * PAGE)
    yield address
    libc.munmap(address, 4 * PAGE)


def _bytes(address: int, nbytes: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=np.uint8).copy()


def _resident_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_whole_pages_go_and_read_as_zeros(mapped: int) -> None:
    assert private_anonymous(mapped, 4 * PAGE)
    assert release_idle_pages(mapped, 4 * PAGE) == 4 * PAGE
    assert not _bytes(mapped, 4 * PAGE).any()
    ctypes.memset(mapped, 1, PAGE)  # still mapped: a write faults a page in
    assert (_bytes(mapped, PAGE) == 1).all()


def test_only_the_pages_inside_the_range_go(mapped: int) -> None:
    # One byte short of the first page and of the third: only the second page is whole.
    assert release_idle_pages(mapped + 1, 3 * PAGE - 2) == PAGE
    data = _bytes(mapped, 4 * PAGE)
    assert (data[:PAGE] == 0xAB).all() and not data[PAGE:2 * PAGE].any()
    assert (data[2 * PAGE:] == 0xAB).all()


@pytest.mark.parametrize(("offset", "nbytes", "released"), [
    (0, PAGE, PAGE),  # exactly one page
    (0, PAGE - 1, 0),  # one byte short of it
    (1, PAGE, 0),  # a page's worth, across two pages
    (0, 0, 0),  # nothing
])
def test_boundaries(mapped: int, offset: int, nbytes: int, released: int) -> None:
    assert release_idle_pages(mapped + offset, nbytes) == released
    data = _bytes(mapped, 4 * PAGE)
    assert int((data == 0).sum()) == released and int((data == 0xAB).sum()) == 4 * PAGE - released


def test_resident_memory_drops() -> None:
    nbytes = 64 * 2**20
    address = libc.mmap_anonymous(nbytes)
    try:
        ctypes.memset(address, 7, nbytes)
        before = _resident_kib()
        assert release_idle_pages(address, nbytes) == nbytes
        assert before - _resident_kib() > 60 * 1024
    finally:
        libc.munmap(address, nbytes)


def test_a_shared_mapping_keeps_its_bytes() -> None:
    shared = mmap.mmap(-1, 2 * PAGE)  # MAP_SHARED: its pages are not this process's alone
    shared.write(b"\x5a" * (2 * PAGE))
    address = ctypes.addressof(ctypes.c_char.from_buffer(shared))
    try:
        assert not private_anonymous(address, 2 * PAGE)
        assert release_idle_pages(address, 2 * PAGE) == 0
        assert (_bytes(address, 2 * PAGE) == 0x5A).all()
    finally:
        del address
        shared.close()


def test_a_file_mapping_keeps_its_bytes(tmp_path: object) -> None:
    path = tmp_path / "data"  # type: ignore[operator]
    path.write_bytes(b"\x11" * (2 * PAGE))
    with open(path, "r+b") as file:
        mapping = mmap.mmap(file.fileno(), 2 * PAGE, flags=mmap.MAP_PRIVATE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        assert release_idle_pages(address, 2 * PAGE) == 0
        assert (_bytes(address, 2 * PAGE) == 0x11).all()
        del address
        mapping.close()


def test_a_range_with_a_hole_gives_back_nothing(mapped: int) -> None:
    libc.munmap(mapped + PAGE, PAGE)  # the second page is no longer mapped (the fixture's
    assert not private_anonymous(mapped, 3 * PAGE)  # munmap of all four is still fine)
    assert release_idle_pages(mapped, 3 * PAGE) == 0
    assert (_bytes(mapped, PAGE) == 0xAB).all()
    assert (_bytes(mapped + 2 * PAGE, PAGE) == 0xAB).all()


def test_a_locked_range_keeps_its_bytes(mapped: int) -> None:
    try:
        libc.mlock(mapped, PAGE)
    except OSError:
        pytest.skip("mlock refused here (RLIMIT_MEMLOCK)")
    try:
        assert release_idle_pages(mapped, PAGE) == 0
        assert (_bytes(mapped, PAGE) == 0xAB).all()
    finally:
        libc.munlock(mapped, PAGE)


def test_an_integer_of_numpy_counts(mapped: int) -> None:
    assert release_idle_pages(np.uint64(mapped), np.int64(PAGE)) == PAGE


@pytest.mark.parametrize(("address", "nbytes"), [
    (4096.0, 4096), (4096, 4096.5), (4096, -1), (0, 4096), (-4096, 4096), ("4096", 1),
])
def test_bad_arguments_raise(address: object, nbytes: object) -> None:
    with pytest.raises(InvalidArgumentError):
        release_idle_pages(address, nbytes)  # type: ignore[arg-type]
