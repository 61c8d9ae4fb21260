"""The simulated memory: each device's bytes, pinned host memory, managed memory, registrations.

Every device is one anonymous ``mmap`` of its capacity (the OS commits pages only when they are
touched), carved first-fit into ``cudaMalloc`` blocks aligned to 256 bytes. Freed ranges stay
mapped, so a kernel that touches freed memory is *detected* (a sticky error, as on a GPU) instead
of crashing the process; an access is legal only inside a live allocation or a registration.
Pinned (``cudaHostAlloc``) and managed memory get one mapping each, page aligned. Addresses are
real host addresses, so a test can look at a device's bytes (``Simulator.read``) and views made
over them behave as on a machine with unified addressing.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
from dataclasses import dataclass

__all__ = ["ALIGNMENT", "Allocation", "DeviceHeap", "Memory"]

#: What cudaMalloc guarantees.
ALIGNMENT = 256
_PAGE = mmap.PAGESIZE


def _address(buffer: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


@dataclass(frozen=True)
class Allocation:
    """One live allocation: where, how big, what kind (``device``, ``managed``, ``host``,
    ``registered``) and on which device (the current one when it was made)."""

    address: int
    nbytes: int
    kind: str
    device: int
    flags: int = 0

    @property
    def end(self) -> int:
        """One past the last byte."""
        return self.address + self.nbytes


class DeviceHeap:
    """One device's memory: a mapping of ``capacity`` bytes and a first-fit free list over it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.mapping = mmap.mmap(-1, max(capacity, _PAGE))
        self.base = _address(self.mapping)
        self._free: list[tuple[int, int]] = [(self.base, capacity)]  # sorted (start, size)
        self.used = 0

    def allocate(self, nbytes: int) -> int | None:
        """A 256-aligned block of ``nbytes`` (at least one granule), or None when none fits."""
        size = -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
        for index, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[index]
                else:
                    self._free[index] = (start + size, length - size)
                self.used += size
                return start
        return None

    def release(self, address: int, nbytes: int) -> None:
        """Give a block back, merging it with its free neighbours."""
        size = -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
        self.used -= size
        index = bisect.bisect(self._free, (address, 0))
        start, length = address, size
        if index < len(self._free) and self._free[index][0] == start + length:
            length += self._free.pop(index)[1]
        if index > 0 and sum(self._free[index - 1]) == start:
            start, previous = self._free.pop(index - 1)
            length += previous
            index -= 1
        self._free.insert(index, (start, length))

    def contains(self, address: int) -> bool:
        """True when ``address`` is inside this device's mapping (live or not)."""
        return self.base <= address < self.base + self.capacity


class Memory:
    """Every allocation the simulator made, by address, with the mappings that hold them."""

    def __init__(self, devices: int, capacity: int) -> None:
        self.heaps = [DeviceHeap(capacity) for _ in range(devices)]
        self.managed_used = [0] * devices
        self.live: dict[int, Allocation] = {}
        self._maps: dict[int, mmap.mmap] = {}  # host and managed mappings, by address
        self._starts: list[int] = []  # sorted addresses of self.live

    # --- making and freeing ----------------------------------------------------------------

    def _add(self, allocation: Allocation) -> Allocation:
        self.live[allocation.address] = allocation
        bisect.insort(self._starts, allocation.address)
        return allocation

    def _remove(self, address: int) -> None:
        del self.live[address]
        self._starts.pop(bisect.bisect_left(self._starts, address))

    def device_alloc(self, device: int, nbytes: int) -> Allocation | None:
        """A cudaMalloc block on ``device``, or None when the device is full."""
        address = self.heaps[device].allocate(nbytes)
        if address is None:
            return None
        return self._add(Allocation(address, nbytes, "device", device))

    def mapped_alloc(self, device: int, nbytes: int, kind: str) -> Allocation | None:
        """Pinned host (``host``) or ``managed`` memory; managed bytes count against ``device``."""
        if kind == "managed":
            heap = self.heaps[device]
            if heap.used + self.managed_used[device] + nbytes > heap.capacity:
                return None
            self.managed_used[device] += nbytes
        mapping = mmap.mmap(-1, -(-max(nbytes, 1) // _PAGE) * _PAGE)
        address = _address(mapping)
        self._maps[address] = mapping
        return self._add(Allocation(address, nbytes, kind, device))

    def free(self, address: int, kinds: tuple[str, ...]) -> Allocation | None:
        """Free the allocation starting at ``address`` if it is of one of ``kinds``."""
        allocation = self.live.get(address)
        if allocation is None or allocation.kind not in kinds:
            return None
        self._remove(address)
        if allocation.kind == "device":
            self.heaps[allocation.device].release(address, allocation.nbytes)
        else:
            if allocation.kind == "managed":
                self.managed_used[allocation.device] -= allocation.nbytes
            # The mapping stays until the simulator closes: a late access reads stale bytes,
            # it does not crash the process.
        return allocation

    def register(self, address: int, nbytes: int, flags: int) -> bool:
        """Register a host range; False when it overlaps a registration or pinned memory."""
        if any(a.kind in ("registered", "host") for a in self.overlapping(address, nbytes)):
            return False
        self._add(Allocation(address, nbytes, "registered", -1, flags))
        return True

    def unregister(self, address: int) -> bool:
        """Unregister the range that starts at ``address``; False when there is none."""
        return self.free(address, ("registered",)) is not None

    # --- looking up ------------------------------------------------------------------------

    def overlapping(self, address: int, nbytes: int) -> list[Allocation]:
        """The live allocations that share a byte with ``[address, address + nbytes)``."""
        found = []
        index = bisect.bisect_right(self._starts, address + max(nbytes, 1) - 1)
        while index > 0:
            index -= 1
            allocation = self.live[self._starts[index]]
            if allocation.end > address:
                found.append(allocation)
            elif allocation.kind == "device":
                break  # device blocks never nest; older host ranges may still reach
        return found

    def owner(self, address: int, nbytes: int) -> Allocation | None:
        """The live allocation holding the whole range, if any."""
        for allocation in self.overlapping(address, nbytes):
            if allocation.address <= address and address + nbytes <= allocation.end:
                return allocation
        return None

    def in_device_heap(self, address: int) -> int | None:
        """The device whose mapping ``address`` falls in, live or freed."""
        for device, heap in enumerate(self.heaps):
            if heap.contains(address):
                return device
        return None

    def ours(self, address: int, nbytes: int) -> bool:
        """True when the simulator made (or freed) memory there: access must be checked."""
        return self.in_device_heap(address) is not None or any(
            address < end and start < address + nbytes for start, end in self._map_ranges()
        )

    def _map_ranges(self) -> list[tuple[int, int]]:
        return [(start, start + len(mapping)) for start, mapping in self._maps.items()]

    def accessible(self, address: int, nbytes: int) -> bool:
        """True when a kernel or copy may touch the range: inside one live allocation, or host
        memory the simulator never made (pageable memory a copy may read)."""
        if address == 0:
            return False
        if self.owner(address, nbytes) is not None:
            return True
        return not self.ours(address, nbytes)

    def close(self) -> None:
        """Forget the allocations. The mappings are left to the garbage collector rather than
        unmapped: a view some test still holds must not turn into a crash."""
        self.live.clear()
        self._starts.clear()
