"""HostMemory: real mappings, real unmapping (VmRSS drops), alignment by trimming, THP advice."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import pytest

from tensorarena.errors import (
    DoubleFreeError,
    InvalidSizeError,
    OutOfMemoryError,
    SizeMismatchError,
    UnknownNameError,
)
from tensorarena.memory.host import HUGE_PAGE_SIZE, PAGE_SIZE, HostMemory
from tensorarena.stats import Count

MiB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/self/status")


def _vma_flags(address: int) -> str:
    """The VmFlags line of the mapping holding ``address`` in /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return line
    raise AssertionError(f"no mapping holds {address:#x}")


def test_allocation_is_real_zeroed_page_rounded_memory() -> None:
    host = HostMemory()
    address = host.allocate(10_000)
    assert address % PAGE_SIZE == 0
    assert ctypes.string_at(address, 10_000) == bytes(10_000)  # fresh anonymous pages are zero
    ctypes.memmove(address, b"tensorarena" * 100, 1100)
    assert ctypes.string_at(address, 1100) == b"tensorarena" * 100
    stats = host.statistics()
    assert stats.requested_bytes.current == 10_000 and stats.allocations.current == 1
    assert stats.allocated_bytes.current == stats.reserved_bytes.current == 3 * PAGE_SIZE
    assert host.live_blocks() == {address: 10_000}
    host.deallocate(address, 10_000)
    stats = host.statistics()
    assert stats.requested_bytes == Count(current=0, peak=10_000, total=10_000)
    assert stats.reserved_bytes.current == 0 and stats.allocations == Count(0, 1, 1)


def test_release_unmaps_and_lowers_rss() -> None:
    host = HostMemory()
    nbytes = 64 * MiB
    before = _status_kib("VmRSS")
    address = host.allocate(nbytes)
    assert _status_kib("VmRSS") - before < 8 * 1024, "mapping alone must not fault pages in"
    ctypes.memset(address, 0x11, nbytes)
    touched = _status_kib("VmRSS")
    assert touched - before >= 60 * 1024
    host.deallocate(address, nbytes)
    assert touched - _status_kib("VmRSS") >= 60 * 1024, "munmap must give the pages back"


def test_large_alignment_is_honoured_by_trimming_the_over_mapping() -> None:
    host = HostMemory()
    alignment = 64 * MiB
    before = _status_kib("VmSize")
    address = host.allocate(PAGE_SIZE, alignment)
    assert address % alignment == 0
    # The misaligned head and the tail were unmapped: the process grew by far less than 64 MiB.
    assert _status_kib("VmSize") - before < 4 * 1024
    ctypes.memset(address, 1, PAGE_SIZE)
    host.deallocate(address, PAGE_SIZE)
    assert host.statistics().reserved_bytes.current == 0


def test_huge_pages_align_and_advise_large_regions() -> None:
    host = HostMemory(huge_pages=True)
    assert host.huge_pages
    big = host.allocate(3 * HUGE_PAGE_SIZE)
    small = host.allocate(64 * 1024)
    assert big % HUGE_PAGE_SIZE == 0
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        assert " hg" in _vma_flags(big), "MADV_HUGEPAGE must mark the mapping"
    ctypes.memset(big, 3, 3 * HUGE_PAGE_SIZE)
    host.deallocate(big, 3 * HUGE_PAGE_SIZE)
    host.deallocate(small, 64 * 1024)


def test_numa_binding_on_node_zero() -> None:
    from tensorarena.memory.numa import NumaBindError, memory_policy, node_of_page

    host = HostMemory(numa_node=0)
    try:
        address = host.allocate(4 * PAGE_SIZE)
    except NumaBindError as exc:  # pragma: no cover - containers that forbid mbind
        pytest.skip(f"mbind refused here: {exc}")
    assert memory_policy(address) == ("bind", frozenset({0}))
    ctypes.memset(address, 9, 4 * PAGE_SIZE)
    assert node_of_page(address) == 0
    host.deallocate(address, 4 * PAGE_SIZE)


def test_local_numa_policy_binds_to_the_calling_threads_node() -> None:
    from tensorarena.memory.numa import NumaBindError, NumaTopology, memory_policy

    host = HostMemory(numa_node="local")
    try:
        address = host.allocate(PAGE_SIZE)
    except NumaBindError as exc:  # pragma: no cover
        pytest.skip(f"mbind refused here: {exc}")
    mode, nodes = memory_policy(address)
    assert mode == "bind" and len(nodes) == 1
    assert next(iter(nodes)) in NumaTopology.read().node_ids
    host.deallocate(address, PAGE_SIZE)


def test_unknown_numa_node_is_refused_at_construction() -> None:
    for node in (999, -1, "far", 1.0, True):
        with pytest.raises(UnknownNameError):
            HostMemory(numa_node=node)  # type: ignore[arg-type]


def test_failed_numa_bind_unmaps_and_changes_nothing(tmp_path: Path) -> None:
    from tensorarena.memory.numa import NumaBindError

    # A fake topology says node 7 exists; the real kernel has no node 7, so mbind fails.
    (tmp_path / "node7").mkdir()
    (tmp_path / "node7" / "cpulist").write_text("0\n")
    host = HostMemory(numa_node=7, numa_root=str(tmp_path))
    before_stats = host.statistics()
    before_vm = _status_kib("VmSize")
    for _ in range(20):
        with pytest.raises(NumaBindError):
            host.allocate(4 * MiB)
    assert host.statistics() == before_stats
    assert host.live_blocks() == {}
    assert _status_kib("VmSize") - before_vm < 4 * 1024, "failed allocations must unmap"


def test_errors_leave_the_mapping_alive_and_counters_unchanged() -> None:
    host = HostMemory()
    address = host.allocate(8192)
    before = host.statistics()
    with pytest.raises(SizeMismatchError):
        host.deallocate(address, 4096)
    with pytest.raises(InvalidSizeError):
        host.allocate(0)
    assert host.statistics() == before
    ctypes.memset(address, 0xEE, 8192)  # still mapped: this would crash otherwise
    host.deallocate(address, 8192)
    with pytest.raises(DoubleFreeError):
        host.deallocate(address, 8192)


def test_the_kernel_refusing_a_mapping_is_out_of_memory() -> None:
    host = HostMemory()
    with pytest.raises(OutOfMemoryError, match="refused to map"):
        host.allocate(1 << 59)  # 512 PiB: more address space than x86_64 has
    stats = host.statistics()
    assert stats.allocations.total == 0 and stats.num_ooms == 1


def test_size_strings_are_accepted() -> None:
    host = HostMemory()
    address = host.allocate("64KiB")  # type: ignore[arg-type]
    assert host.live_blocks() == {address: 65536}
    host.deallocate(address, 65536)


def test_concurrent_allocations_are_consistent() -> None:
    host = HostMemory()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(100):
                nbytes = (seed * 100 + i) % 7 * 1000 + 1
                address = host.allocate(nbytes)
                ctypes.memset(address, seed, nbytes)
                assert ctypes.string_at(address, nbytes) == bytes([seed]) * nbytes
                host.deallocate(address, nbytes)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = host.statistics()
    assert stats.allocations.total == stats.allocations.freed == 400
    assert stats.allocations.current == 0


def test_repr_shows_live_state() -> None:
    host = HostMemory(huge_pages=True)
    address = host.allocate(1000)
    text = repr(host)
    assert "live=1" in text and "huge_pages=True" in text and "mapped=4 KiB" in text
    host.deallocate(address, 1000)
