"""The memory-resource protocol, RMM-style: everything that hands out bytes speaks it.

Upstream resources (mmap'd host memory, pinned memory, device memory, address space alone) and
everything built on them (pools, adaptors) share two calls, so they nest freely:

    allocate(nbytes, alignment=256, stream=None) -> int address
    deallocate(address, nbytes, stream=None) -> None

Addresses are plain ints. ``stream`` is an opaque token for stream-ordered resources (the GPU
layer); host resources accept and ignore ``None``. A resource raises the errors of
:mod:`tensorarena.errors` and leaves its state unchanged when it does.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["DEFAULT_ALIGNMENT", "MemoryResource", "Stream"]

DEFAULT_ALIGNMENT = 256

Stream = Any
"""An opaque stream handle; ``None`` means the default (synchronous) stream."""


@runtime_checkable
class MemoryResource(Protocol):
    """Anything that allocates and deallocates bytes at integer addresses."""

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Return the address of ``nbytes`` bytes aligned to ``alignment``."""
        ...

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Give back the block at ``address`` that was allocated with ``nbytes``."""
        ...
