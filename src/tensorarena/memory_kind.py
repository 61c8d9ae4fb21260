"""What a resource's addresses are: memory the CPU may touch, device memory, or numbers only.

Every resource declares a :class:`MemoryKind` (``resource.memory_kind``); adaptors and pools
report their upstream's. Layers that touch bytes check it first: ``tensorarena.empty`` builds
NumPy arrays only over host-accessible memory, and refuses an ``Arena`` or a ``VirtualMemory``
(bookkeeping over numbers: an array over them would crash the process at its first write).
"""

from __future__ import annotations

import enum

__all__ = ["MemoryKind", "memory_kind_of"]


class MemoryKind(enum.Enum):
    """The kind of memory behind a resource's addresses."""

    #: Host memory the CPU reads and writes (pageable, pinned, NUMA-bound).
    HOST = "host"
    #: Device memory (a GPU's): the CPU must not dereference it.
    DEVICE = "device"
    #: Managed (unified) memory: host and device both reach it.
    MANAGED = "managed"
    #: Addresses only, no bytes behind them (bookkeeping, simulation): never dereference.
    ADDRESS_SPACE = "address_space"

    @property
    def host_accessible(self) -> bool:
        """True when the CPU may read and write bytes at these addresses."""
        return self in (MemoryKind.HOST, MemoryKind.MANAGED)


def memory_kind_of(resource: object) -> MemoryKind | None:
    """The kind ``resource`` declares, or ``None`` when it declares none (or a wrong value)."""
    kind = getattr(resource, "memory_kind", None)
    return kind if isinstance(kind, MemoryKind) else None
