"""Small resources for the use() tests: one that refuses after a number of allocations, one
that records what it was asked."""

from __future__ import annotations

from tensorarena.errors import OutOfMemoryError
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource, ResourceAdaptor


class FailAfter(ResourceAdaptor):
    """Serves ``allowed`` allocations from ``upstream``, then refuses every one."""

    def __init__(self, upstream: MemoryResource, allowed: int) -> None:
        self._upstream = upstream
        self.allowed = allowed
        self.alignments: list[int] = []

    def allocate(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: object = None
                 ) -> int:
        self.alignments.append(alignment)
        if self.allowed <= 0:
            raise OutOfMemoryError(nbytes, free=0, largest_free=0, capacity=0,
                                   detail="refused by FailAfter")
        self.allowed -= 1
        return self._upstream.allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self._upstream.deallocate(address, nbytes, stream)
