"""A memory resource that counts its calls, for the runtime tests (public API only)."""

from __future__ import annotations

from tensorarena import HostMemory, MemoryKind


class CountingMemory:
    """``HostMemory`` that records every live block and counts allocations."""

    memory_kind = MemoryKind.HOST

    def __init__(self) -> None:
        self.upstream = HostMemory()
        self.live: dict[int, int] = {}
        self.allocations = 0

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        address = self.upstream.allocate(nbytes, alignment)
        self.live[address] = nbytes
        self.allocations += 1
        return address

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        assert self.live.pop(address) == nbytes
        self.upstream.deallocate(address, nbytes)

    def owns(self, address: int) -> bool:
        """True if ``address`` lies inside one of the live blocks."""
        return any(start <= address < start + n for start, n in self.live.items())
