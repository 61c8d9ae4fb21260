"""What passes through an adaptor, counted in the vocabulary of :mod:`tensorarena.stats`.

An adaptor sees each call's ``nbytes`` and nothing of how the layers below round or place it,
so it counts *requested* bytes and allocations only (current, peak, total) and the requests that
ran out of memory. :class:`Traffic` is the mutable tally (its owner holds the lock);
:class:`TrafficStatistics` the frozen record its ``statistics()`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorarena.stats import Count

__all__ = ["Traffic", "TrafficStatistics"]


@dataclass(frozen=True, slots=True)
class TrafficStatistics:
    """A snapshot of the traffic through an adaptor. ``limit``: its cap, if it has one."""

    requested_bytes: Count
    allocations: Count
    num_ooms: int = 0
    limit: int | None = None


class Traffic:
    """Current, peak and total requested bytes and allocations; OOMs. Not locked itself."""

    __slots__ = ("blocks", "nbytes", "ooms", "peak_blocks", "peak_nbytes", "total_blocks",
                 "total_nbytes")

    def __init__(self) -> None:
        self.nbytes = self.peak_nbytes = self.total_nbytes = 0
        self.blocks = self.peak_blocks = self.total_blocks = 0
        self.ooms = 0

    def allocated(self, nbytes: int) -> None:
        """Count one successful allocation of ``nbytes``."""
        self.nbytes += nbytes
        self.total_nbytes += nbytes
        self.blocks += 1
        self.total_blocks += 1
        if self.nbytes > self.peak_nbytes:
            self.peak_nbytes = self.nbytes
        if self.blocks > self.peak_blocks:
            self.peak_blocks = self.blocks

    def freed(self, nbytes: int) -> None:
        """Count one successful deallocation of ``nbytes``."""
        self.nbytes -= nbytes
        self.blocks -= 1

    def undo(self, nbytes: int, before: TrafficStatistics, *, oom: bool) -> None:
        """Take back an :meth:`allocated` whose call failed: every counter as in ``before``
        (made just before it), except that a failure for lack of memory counts as an OOM."""
        self.nbytes -= nbytes
        self.blocks -= 1
        self.total_nbytes -= nbytes
        self.total_blocks -= 1
        self.peak_nbytes = max(before.requested_bytes.peak, self.nbytes)
        self.peak_blocks = max(before.allocations.peak, self.blocks)
        if oom:
            self.ooms += 1

    def reset_peaks(self) -> None:
        """Set every peak to its current value."""
        self.peak_nbytes = self.nbytes
        self.peak_blocks = self.blocks

    def snapshot(self, *, limit: int | None = None) -> TrafficStatistics:
        """The frozen record."""
        return TrafficStatistics(
            requested_bytes=Count(self.nbytes, self.peak_nbytes, self.total_nbytes),
            allocations=Count(self.blocks, self.peak_blocks, self.total_blocks),
            num_ooms=self.ooms,
            limit=limit,
        )
