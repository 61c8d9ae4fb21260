"""Address space alone: a resource that hands out addresses and never touches a byte.

``VirtualMemory`` simulates an upstream of any size — terabytes on a laptop — for replaying traces,
sizing pools and planning. Addresses increase monotonically from ``base`` and are never reused,
so an address seen in a trace names one allocation only. Live blocks are tracked exactly like a
real resource (double free, foreign address and size mismatch raise the same errors), so a
``Pool`` over it behaves as over real memory, minus the bytes. Never dereference its addresses.
"""

from __future__ import annotations

import dataclasses
import threading

from tensorarena.errors import InvalidAddressError, OutOfMemoryError
from tensorarena.memory.live_blocks import LiveBlocks
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryKind, Stream
from tensorarena.sizes import Size, align_up, check_address, check_request, format_size, parse_size
from tensorarena.stats import Count, MemoryStatistics

__all__ = ["DEFAULT_VIRTUAL_BASE", "DEFAULT_VIRTUAL_CAPACITY", "VirtualMemory"]

#: 16 TiB: far from where a real process maps anything, and aligned to everything sensible.
DEFAULT_VIRTUAL_BASE = 1 << 44
#: 128 TiB: the whole user address space of x86_64 with 4-level paging.
DEFAULT_VIRTUAL_CAPACITY = 1 << 47


class VirtualMemory:
    """A bump allocator over ``[base, base + capacity)`` of pure address space."""

    #: Addresses only: never dereference them (``tensorarena.empty`` refuses this resource).
    memory_kind = MemoryKind.ADDRESS_SPACE

    def __init__(
        self, capacity: Size = DEFAULT_VIRTUAL_CAPACITY, *, base: int = DEFAULT_VIRTUAL_BASE
    ) -> None:
        self._capacity = parse_size(capacity, name="capacity")
        base = check_address(base, name="base")
        if base == 0:
            raise InvalidAddressError("base must be positive (0 is the null address)", address=0)
        self._base = base
        self._cursor = base
        self._blocks = LiveBlocks("VirtualMemory")
        self._lock = threading.Lock()

    # --- the resource protocol -------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Return the next ``alignment``-aligned address with ``nbytes`` of room after it."""
        nbytes, alignment = check_request(nbytes, alignment)
        with self._lock:
            address = align_up(self._cursor, alignment)
            end = address + nbytes
            limit = self._base + self._capacity
            if end > limit:
                room = max(limit - address, 0)
                self._blocks.count_oom()
                raise OutOfMemoryError(
                    nbytes,
                    free=room,
                    largest_free=room,
                    capacity=self._capacity,
                    allocated=self._blocks.requested,
                    detail="virtual address space is never reused: make a larger VirtualMemory",
                )
            # Reserved counts the alignment padding too: that address space is gone for good.
            self._blocks.add(address, nbytes, end - self._cursor)
            self._cursor = end
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Forget the block at ``address``; its addresses are not handed out again."""
        with self._lock:
            address, _ = self._blocks.lookup(address, nbytes)
            self._blocks.remove(address)

    # --- queries ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Size of the address range in bytes."""
        return self._capacity

    @property
    def base(self) -> int:
        """The first address of the range."""
        return self._base

    @property
    def used(self) -> int:
        """Address space consumed so far (live or freed: it is never reused)."""
        return self._cursor - self._base

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return self._blocks.live_blocks()

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot. ``reserved_bytes`` is the address space used so far (never
        reused, so it only grows), ``limit`` the capacity."""
        with self._lock:
            used = self.used
            stats = self._blocks.statistics(reserved=Count(used, used, used))
        return dataclasses.replace(stats, limit=self._capacity)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._blocks.reset_peaks()

    def __repr__(self) -> str:
        return (
            f"VirtualMemory(capacity={format_size(self._capacity)}, base={self._base:#x}, "
            f"used={format_size(self.used)}, live={len(self._blocks)}, "
            f"requested={format_size(self._blocks.requested)})"
        )
