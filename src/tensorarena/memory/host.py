"""Pageable host memory: one anonymous ``mmap`` per allocation, unmapped when it is freed.

``HostMemory`` is the upstream of every host pool. Each allocation maps a fresh region (rounded up
to whole pages), so freeing it hands the pages straight back to the kernel: the resident set
really drops, which is what lets a pool's ``trim()`` return memory to the system. A system call
per request is why this is an *upstream* — tensors should come from a pool over it.

Alignment: ``mmap`` returns page-aligned addresses; an alignment above the page size is honoured
by over-mapping ``alignment - page`` extra bytes and unmapping the misaligned head and the unused
tail, so the live mapping is exactly the block. With ``huge_pages=True`` regions of 2 MiB or more
start on a 2 MiB boundary and are advised ``MADV_HUGEPAGE`` (transparent huge pages: one fault
per 2 MiB instead of per 4 KiB). The advice is best effort: a kernel without THP ignores it.

``numa_node=N`` binds every region to node N with ``mbind`` before any page is touched;
``numa_node="local"`` binds each region to the node of the CPU the allocating thread is on.

Thread-safe: the ledger is guarded by a lock; ``mmap`` runs outside it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Literal

from tensorarena.errors import OutOfMemoryError
from tensorarena.memory import libc
from tensorarena.memory.live_blocks import LiveBlocks
from tensorarena.memory.numa import (
    DEFAULT_SYSFS_ROOT,
    NumaTopology,
    bind_to_node,
)
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryKind, Stream
from tensorarena.sizes import align_up, check_request, format_size
from tensorarena.stats import MemoryStatistics

__all__ = ["HUGE_PAGE_SIZE", "PAGE_SIZE", "HostMemory", "map_region", "unmap_region"]

PAGE_SIZE = libc.PAGE_SIZE
#: Size of a transparent huge page on x86_64 and (4 KiB-page) aarch64.
HUGE_PAGE_SIZE = 2 * 1024 * 1024

NumaPolicy = int | Literal["local"] | None


def _available_memory() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def map_region(length: int, alignment: int) -> int:
    """Map ``length`` bytes (a page multiple) starting at a multiple of ``alignment``.

    Raises :class:`OutOfMemoryError` when the kernel refuses the mapping.
    """
    span = length if alignment <= PAGE_SIZE else length + alignment - PAGE_SIZE
    try:
        base = libc.mmap_anonymous(span)
    except OSError as exc:
        available = _available_memory()
        raise OutOfMemoryError(
            length,
            free=available,
            largest_free=available,
            capacity=available,
            detail=f"the kernel refused to map {format_size(span)}: {exc.strerror}",
        ) from exc
    if span == length:
        return base
    address = align_up(base, alignment)
    head = address - base
    tail = span - head - length
    if head:
        libc.munmap(base, head)
    if tail:
        libc.munmap(address + length, tail)
    return address


def unmap_region(address: int, length: int) -> None:
    """Unmap a region made by :func:`map_region`; its pages leave the resident set at once."""
    libc.munmap(address, length)


class HostMemory:
    """Pageable host memory from anonymous ``mmap``: a region per allocation, unmapped on free."""

    #: Host memory: the CPU reads and writes it.
    memory_kind = MemoryKind.HOST

    def __init__(
        self,
        *,
        huge_pages: bool = False,
        numa_node: NumaPolicy = None,
        numa_root: str = DEFAULT_SYSFS_ROOT,
    ) -> None:
        if not libc.available():
            raise OSError("HostMemory needs Linux (anonymous mmap through libc)")
        self._huge_pages = bool(huge_pages)
        self._topology: NumaTopology | None = None
        if numa_node is not None:
            self._topology = NumaTopology.read(numa_root)
            if numa_node != "local":
                self._topology.node(numa_node)  # raises UnknownNameError naming the nodes
        self._numa_node = numa_node
        self._blocks = LiveBlocks("HostMemory")
        self._lock = threading.Lock()

    # --- the resource protocol -------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Map a fresh region of at least ``nbytes`` bytes aligned to ``alignment``."""
        nbytes, alignment = check_request(nbytes, alignment)
        length = align_up(nbytes, PAGE_SIZE)
        if self._huge_pages and length >= HUGE_PAGE_SIZE:
            alignment = max(alignment, HUGE_PAGE_SIZE)
        try:
            address = map_region(length, alignment)
        except OutOfMemoryError:
            with self._lock:
                self._blocks.count_oom()
            raise
        try:
            if self._huge_pages and length >= HUGE_PAGE_SIZE:
                # Advice only: a kernel without THP still gives correct memory.
                with contextlib.suppress(OSError):
                    libc.madvise(address, length, libc.MADV_HUGEPAGE)
            if self._numa_node is not None:
                bind_to_node(address, length, self._resolve_node())
        except BaseException:
            unmap_region(address, length)
            raise
        with self._lock:
            self._blocks.add(address, nbytes, length)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Unmap the region at ``address``, which was allocated with ``nbytes``."""
        with self._lock:
            address, (_, length, _) = self._blocks.lookup(address, nbytes)
            unmap_region(address, length)
            self._blocks.remove(address)

    # --- queries ---------------------------------------------------------------------------

    @property
    def huge_pages(self) -> bool:
        """Whether regions of 2 MiB or more are advised to use transparent huge pages."""
        return self._huge_pages

    @property
    def numa_node(self) -> NumaPolicy:
        """The NUMA binding: a node id, ``"local"``, or ``None`` (the kernel's default policy)."""
        return self._numa_node

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return self._blocks.live_blocks()

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot: ``allocated_bytes`` (= ``reserved_bytes``) counts mapped bytes."""
        with self._lock:
            return self._blocks.statistics()

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._blocks.reset_peaks()

    def __repr__(self) -> str:
        extras = ""
        if self._huge_pages:
            extras += ", huge_pages=True"
        if self._numa_node is not None:
            extras += f", numa_node={self._numa_node!r}"
        return (
            f"HostMemory(live={len(self._blocks)}, "
            f"requested={format_size(self._blocks.requested)}, "
            f"mapped={format_size(self._blocks.held)}{extras})"
        )

    # --- internals -------------------------------------------------------------------------

    def _resolve_node(self) -> int:
        assert self._topology is not None
        if self._numa_node == "local":
            return self._topology.local_node()
        return self._numa_node  # type: ignore[return-value]
