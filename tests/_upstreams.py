"""Small upstream resources for the adaptor tests: real bytes (ctypes buffers), counted calls.

``BufferMemory`` hands out real, writable memory (one ctypes buffer per block), checks every
deallocation strictly, counts its calls, and can be told to fail, so tests can prove that an
adaptor leaves everything unchanged when its upstream refuses. Its own lock makes it safe to
share between threads, which lets the tests tell adaptor bugs from upstream races.
"""

from __future__ import annotations

import ctypes
import threading

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    OutOfMemoryError,
    SizeMismatchError,
)
from tensorarena.memory_kind import MemoryKind
from tensorarena.sizes import check_alignment


class BufferMemory:
    """Real memory, one ctypes buffer per allocation; strict about frees; counts calls."""

    memory_kind = MemoryKind.HOST

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[ctypes.Array[ctypes.c_char], int]] = {}
        self._freed: set[int] = set()
        self._lock = threading.Lock()
        self.allocations = 0
        self.deallocations = 0
        self.fail_allocations = False

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        check_alignment(alignment)
        if type(nbytes) is not int or nbytes <= 0:
            raise ValueError(f"bad nbytes {nbytes!r}")
        with self._lock:
            if self.fail_allocations:
                raise OutOfMemoryError(nbytes, free=0, largest_free=0, capacity=0)
            buffer = ctypes.create_string_buffer(nbytes + alignment)
            address = (ctypes.addressof(buffer) + alignment - 1) & -alignment
            self._buffers[address] = (buffer, nbytes)
            self._freed.discard(address)
            self.allocations += 1
            return address

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        with self._lock:
            entry = self._buffers.get(address)
            if entry is None:
                cls = DoubleFreeError if address in self._freed else InvalidAddressError
                raise cls(f"{address:#x} is not live in BufferMemory", address=address)
            if entry[1] != nbytes:
                raise SizeMismatchError(
                    "size mismatch", address=address, given=nbytes, allocated=entry[1]
                )
            del self._buffers[address]
            self._freed.add(address)
            self.deallocations += 1

    @property
    def live(self) -> int:
        """Blocks handed out and not yet freed."""
        return len(self._buffers)

    @property
    def live_bytes(self) -> int:
        return sum(n for _, n in self._buffers.values())
