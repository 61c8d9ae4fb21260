"""The live-block ledger shared by the upstream resources (host, pinned, virtual).

An upstream resource must answer three questions before it touches the system: is this request
valid, is this address one of mine and live, was it freed with the size it was allocated with?
:class:`LiveBlocks` answers them and keeps the counters, so every resource checks input the same
way and raises *before* any state changes.

Freed addresses are remembered in a bounded window (the most recent ``RECENT_FREES``) so a double
free is named as such; an address freed longer ago is still refused, as a foreign address. The
bound keeps a long-running process from growing a set of every address it ever freed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    SizeMismatchError,
)

__all__ = ["RECENT_FREES", "LiveBlocks", "ResourceStatistics"]

#: How many freed addresses are remembered to tell a double free from a foreign address.
RECENT_FREES = 4096


@dataclass(frozen=True, slots=True)
class ResourceStatistics:
    """A snapshot of an upstream resource's counters. All sizes in bytes."""

    allocated: int  #: bytes requested by live blocks
    peak_allocated: int  #: the most ``allocated`` has been
    reserved: int  #: bytes held for live blocks (requests rounded up to pages, alignment slack)
    peak_reserved: int  #: the most ``reserved`` has been
    live_blocks: int
    alloc_count: int  #: successful allocations since creation
    free_count: int  #: successful deallocations since creation


class LiveBlocks:
    """Address → (requested bytes, reserved bytes, resource-specific token), plus counters."""

    __slots__ = (
        "_alloc_count",
        "_allocated",
        "_free_count",
        "_live",
        "_owner",
        "_peak_allocated",
        "_peak_reserved",
        "_recent_frees",
        "_reserved",
    )

    def __init__(self, owner: str) -> None:
        self._owner = owner  # named in error messages: "HostMemory", ...
        self._live: dict[int, tuple[int, int, object]] = {}
        self._recent_frees: OrderedDict[int, None] = OrderedDict()
        self._allocated = 0
        self._reserved = 0
        self._peak_allocated = 0
        self._peak_reserved = 0
        self._alloc_count = 0
        self._free_count = 0

    # --- checks (no state change) ----------------------------------------------------------

    def lookup(self, address: object, nbytes: object) -> tuple[int, int, object]:
        """The live entry at ``address`` freed with ``nbytes``; raise if it is not exactly that."""
        entry = self._live.get(address) if type(address) is int else None
        if entry is None:
            raise self.not_live(address)
        if nbytes != entry[0] or type(nbytes) is not int:
            raise SizeMismatchError(
                f"{self._owner}: block at {address:#x} was allocated with {entry[0]} bytes, "
                f"deallocated with {nbytes!r}",
                address=address,  # type: ignore[arg-type]
                given=nbytes,  # type: ignore[arg-type]
                allocated=entry[0],
            )
        return entry

    def not_live(self, address: object) -> InvalidAddressError:
        """The error for freeing ``address`` that is not live here."""
        if type(address) is not int:
            return InvalidAddressError(
                f"{self._owner}: address must be an int, not {type(address).__name__} "
                f"({address!r})",
                address=-1,
            )
        if address in self._recent_frees:
            return DoubleFreeError(
                f"{self._owner}: double free: block at {address:#x} was already freed",
                address=address,
            )
        return InvalidAddressError(
            f"{self._owner}: address {address:#x} was never allocated here (or freed long ago)",
            address=address,
        )

    # --- updates ---------------------------------------------------------------------------

    def add(self, address: int, nbytes: int, reserved: int, token: object = None) -> None:
        """Record a new live block (the caller has already obtained the memory)."""
        self._live[address] = (nbytes, reserved, token)
        self._recent_frees.pop(address, None)
        self._allocated += nbytes
        self._reserved += reserved
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved
        self._alloc_count += 1

    def remove(self, address: int) -> None:
        """Forget a live block (after :meth:`lookup` succeeded and the memory was released)."""
        nbytes, reserved, _ = self._live.pop(address)
        self._allocated -= nbytes
        self._reserved -= reserved
        self._free_count += 1
        self._recent_frees[address] = None
        if len(self._recent_frees) > RECENT_FREES:
            self._recent_frees.popitem(last=False)

    # --- queries ---------------------------------------------------------------------------

    @property
    def allocated(self) -> int:
        """Bytes requested by live blocks."""
        return self._allocated

    @property
    def reserved(self) -> int:
        """Bytes held for live blocks."""
        return self._reserved

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, address: object) -> bool:
        return address in self._live

    def items(self) -> list[tuple[int, tuple[int, int, object]]]:
        """A copy of the live entries."""
        return list(self._live.items())

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        return {address: entry[0] for address, entry in self._live.items()}

    def statistics(self) -> ResourceStatistics:
        """A frozen snapshot of the counters."""
        return ResourceStatistics(
            allocated=self._allocated,
            peak_allocated=self._peak_allocated,
            reserved=self._reserved,
            peak_reserved=self._peak_reserved,
            live_blocks=len(self._live),
            alloc_count=self._alloc_count,
            free_count=self._free_count,
        )
