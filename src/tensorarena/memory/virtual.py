"""Address space alone: a resource that hands out addresses and never touches a byte.

``VirtualMemory`` simulates an upstream of any size — terabytes on a laptop — for replaying traces,
sizing pools and planning. Addresses increase monotonically from ``base`` and are never reused,
so an address seen in a trace names one allocation only. Live blocks are tracked exactly like a
real resource (double free, foreign address and size mismatch raise the same errors), so a
``Pool`` over it behaves as over real memory, minus the bytes. Never dereference its addresses.
"""

from __future__ import annotations

import threading

from tensorarena.errors import InvalidAddressError, OutOfMemoryError
from tensorarena.memory._live import LiveBlocks, ResourceStatistics
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, Stream
from tensorarena.sizes import Size, align_up, check_request, format_size, parse_size

__all__ = ["DEFAULT_VIRTUAL_BASE", "DEFAULT_VIRTUAL_CAPACITY", "VirtualMemory"]

#: 16 TiB: far from where a real process maps anything, and aligned to everything sensible.
DEFAULT_VIRTUAL_BASE = 1 << 44
#: 128 TiB: the whole user address space of x86_64 with 4-level paging.
DEFAULT_VIRTUAL_CAPACITY = 1 << 47


class VirtualMemory:
    """A bump allocator over ``[base, base + capacity)`` of pure address space."""

    def __init__(
        self, capacity: Size = DEFAULT_VIRTUAL_CAPACITY, *, base: int = DEFAULT_VIRTUAL_BASE
    ) -> None:
        self._capacity = parse_size(capacity, name="capacity")
        if type(base) is not int or base <= 0:
            raise InvalidAddressError(f"base must be a positive int, got {base!r}", address=-1)
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
                raise OutOfMemoryError(
                    nbytes,
                    free=room,
                    largest_free=room,
                    capacity=self._capacity,
                    allocated=self._blocks.allocated,
                    detail="virtual address space is never reused: make a larger VirtualMemory",
                )
            # Reserved counts the alignment padding too: that address space is gone for good.
            self._blocks.add(address, nbytes, end - self._cursor)
            self._cursor = end
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Forget the block at ``address``; its addresses are not handed out again."""
        with self._lock:
            self._blocks.lookup(address, nbytes)
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

    def statistics(self) -> ResourceStatistics:
        """A frozen snapshot of the counters."""
        with self._lock:
            return self._blocks.statistics()

    def __repr__(self) -> str:
        return (
            f"VirtualMemory(capacity={format_size(self._capacity)}, base={self._base:#x}, "
            f"used={format_size(self.used)}, live={len(self._blocks)}, "
            f"allocated={format_size(self._blocks.allocated)})"
        )
