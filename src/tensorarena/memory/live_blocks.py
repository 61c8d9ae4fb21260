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

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    SizeMismatchError,
)
from tensorarena.sizes import check_address, check_nbytes
from tensorarena.stats import Count, MemoryStatistics

__all__ = ["RECENT_FREES", "LiveBlocks"]

#: How many freed addresses are remembered to tell a double free from a foreign address.
RECENT_FREES = 4096


class LiveBlocks:
    """Address → (requested bytes, held bytes, resource-specific token), plus counters.

    *held* is what the block really takes from the system (whole pages, alignment slack): the
    resource's ``allocated_bytes`` in the vocabulary of :mod:`tensorarena.stats`.
    """

    __slots__ = (
        "_held",
        "_live",
        "_num_ooms",
        "_owner",
        "_peak_blocks",
        "_peak_held",
        "_peak_requested",
        "_recent_frees",
        "_requested",
        "_total_blocks",
        "_total_held",
        "_total_requested",
    )

    def __init__(self, owner: str) -> None:
        self._owner = owner  # named in error messages: "HostMemory", ...
        self._live: dict[int, tuple[int, int, object]] = {}
        self._recent_frees: OrderedDict[int, None] = OrderedDict()
        self._requested = self._peak_requested = self._total_requested = 0
        self._held = self._peak_held = self._total_held = 0
        self._peak_blocks = self._total_blocks = 0
        self._num_ooms = 0

    # --- checks (no state change) ----------------------------------------------------------

    def lookup(self, address: object, nbytes: object) -> tuple[int, tuple[int, int, object]]:
        """``(address, entry)`` of the live block at ``address`` freed with ``nbytes``, both
        normalised to exact ints; raise if it is not exactly that."""
        address = check_address(address)
        entry = self._live.get(address)
        if entry is None:
            raise self.not_live(address)
        if type(nbytes) is not int:
            nbytes = check_nbytes(nbytes)
        if nbytes != entry[0]:
            raise SizeMismatchError(
                f"{self._owner}: block at {address:#x} was allocated with {entry[0]} bytes, "
                f"deallocated with {nbytes!r}",
                address=address,
                given=nbytes,
                allocated=entry[0],
            )
        return address, entry

    def not_live(self, address: int) -> InvalidAddressError:
        """The error for freeing ``address`` that is not live here."""
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

    def add(self, address: int, nbytes: int, held: int, token: object = None) -> None:
        """Record a new live block (the caller has already obtained the memory)."""
        self._live[address] = (nbytes, held, token)
        self._recent_frees.pop(address, None)
        self._requested += nbytes
        self._total_requested += nbytes
        self._held += held
        self._total_held += held
        self._total_blocks += 1
        self._peak_requested = max(self._peak_requested, self._requested)
        self._peak_held = max(self._peak_held, self._held)
        self._peak_blocks = max(self._peak_blocks, len(self._live))

    def remove(self, address: int) -> None:
        """Forget a live block (after :meth:`lookup` succeeded and the memory was released)."""
        nbytes, held, _ = self._live.pop(address)
        self._requested -= nbytes
        self._held -= held
        self._recent_frees[address] = None
        if len(self._recent_frees) > RECENT_FREES:
            self._recent_frees.popitem(last=False)

    def count_oom(self) -> None:
        """Count a request refused with OutOfMemoryError."""
        self._num_ooms += 1

    def reset_peaks(self) -> None:
        """Set every peak to its current value."""
        self._peak_requested = self._requested
        self._peak_held = self._held
        self._peak_blocks = len(self._live)

    # --- queries ---------------------------------------------------------------------------

    @property
    def requested(self) -> int:
        """Bytes requested by live blocks."""
        return self._requested

    @property
    def held(self) -> int:
        """Bytes live blocks take from the system."""
        return self._held

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

    def statistics(self, *, reserved: Count | None = None) -> MemoryStatistics:
        """A frozen snapshot. Each block is its own region from the system, so by default
        ``reserved_bytes`` is ``allocated_bytes`` and ``segments`` counts the blocks."""
        held = Count(self._held, self._peak_held, self._total_held)
        blocks = Count(len(self._live), self._peak_blocks, self._total_blocks)
        return MemoryStatistics(
            requested_bytes=Count(self._requested, self._peak_requested, self._total_requested),
            allocated_bytes=held,
            active_bytes=held,
            reserved_bytes=held if reserved is None else reserved,
            allocations=blocks,
            segments=blocks,
            num_ooms=self._num_ooms,
            num_upstream_allocs=self._total_blocks,
            num_upstream_frees=self._total_blocks - len(self._live),
        )
