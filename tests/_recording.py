"""A host resource that records every block it takes back (shared by the owner tests)."""

from __future__ import annotations

from tensorarena.memory.host import HostMemory
from tensorarena.memory_kind import MemoryKind


class RecordingResource:
    """A host resource that records every block it takes back as ``(address, nbytes)``, so an
    early, late, lost or second free shows up as a difference in ``freed``."""

    memory_kind = MemoryKind.HOST

    def __init__(self) -> None:
        self.host = HostMemory()
        self.freed: list[tuple[int, int]] = []

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return self.host.allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.freed.append((address, nbytes))
        self.host.deallocate(address, nbytes, stream)

    def live(self) -> dict[int, int]:
        return self.host.live_blocks()
