"""``Tracking``: every live allocation, with where it was made — leak reports and explained OOMs.

The adaptor keeps one map, address → (bytes, alignment, sequence number, stack), filled on
allocate and emptied on free. What is left in it is what the program still holds:
:meth:`Tracking.outstanding` lists it, :meth:`Tracking.report` groups it by allocation site
(count and bytes, largest first), and ``report_at_exit=True`` issues the report as a
:class:`~tensorarena.errors.LeakWarning` when the interpreter exits with allocations live. A
clean program reports nothing: the report is empty and no warning is issued.

Stacks are off by default (``stack_depth=0``): capturing 8 frames a call costs about half
of what a pool's allocate+free pair costs (:mod:`tensorarena.adaptors.sites`), so a
leak hunt turns it on: ``Tracking(pool, stack_depth=8)``. Without stacks the report groups by
size instead of site.
:meth:`mark` and ``since=`` restrict a report to the allocations made after a point, the usual
way to ask "what did this training step leave behind?".

Out of memory: when the upstream raises :class:`~tensorarena.errors.OutOfMemoryError`, this
adaptor adds to the error's message the top allocation sites of what is live and, from the first
layer below that keeps memory statistics (a pool, say), reserved vs allocated bytes and the
fragmentation figure — the three numbers that tell "too much is live" from "the pool is
fragmented" from "the cache holds it". The error keeps its class and every number it carried.

Thread-safety: the map is a dict changed by single ``dict`` operations, which are atomic in
CPython; a free takes its entry out *before* the upstream call (and puts it back if the call
fails), so a concurrent allocation that gets the same address from the upstream cannot lose its
entry. Sizes and addresses are normalised at this edge like every adaptor's.
"""

from __future__ import annotations

import atexit
import itertools
import warnings
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

from tensorarena.adaptors.sites import Stack, capture, format_site, format_stack
from tensorarena.errors import InvalidArgumentError, LeakWarning, OutOfMemoryError
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
    resource_stack,
)
from tensorarena.sizes import MAX_SIZE, check_address, check_nbytes, format_size

__all__ = ["LeakReport", "SiteReport", "TrackedAllocation", "Tracking", "stack_statistics"]

#: Most stack frames a tracker will keep per allocation (deeper stacks cost time, not insight).
MAX_STACK_DEPTH = 64


def check_stack_depth(depth: object) -> int:
    """``stack_depth=`` as an int in ``[0, MAX_STACK_DEPTH]``, else InvalidArgumentError."""
    if type(depth) is not int or not 0 <= depth <= MAX_STACK_DEPTH:
        raise InvalidArgumentError(
            f"stack_depth must be an int from 0 (no stacks) to {MAX_STACK_DEPTH}, got {depth!r}"
        )
    return depth


@dataclass(frozen=True, slots=True)
class TrackedAllocation:
    """One live allocation seen by a :class:`Tracking` adaptor."""

    address: int
    nbytes: int
    alignment: int
    sequence: int  #: its order among the allocations through the adaptor (from 0; marks skip one)
    stack: Stack  #: innermost frame first; ``()`` when stacks were off

    @property
    def site(self) -> str:
        """The innermost frame, ``file.py:12 in function``."""
        return format_site(self.stack)


@dataclass(frozen=True, slots=True)
class SiteReport:
    """The live allocations of one site (one stack), or of one size when stacks were off."""

    stack: Stack
    blocks: int
    nbytes: int
    size: int | None = None  #: the size grouped on when there is no stack, else None

    @property
    def site(self) -> str:
        """The innermost frame of the site, or ``"<N bytes each>"`` for a size group."""
        if not self.stack and self.size is not None:
            return f"<{self.size} bytes each, site unknown>"
        return format_site(self.stack)


@dataclass(frozen=True, slots=True)
class LeakReport:
    """What is still allocated, grouped by site, the most bytes first. True when non-empty."""

    blocks: int
    nbytes: int
    sites: tuple[SiteReport, ...]
    stacks: bool  #: whether the adaptor recorded stacks

    def __bool__(self) -> bool:
        return self.blocks > 0

    def format(self, *, top: int = 10, frames: int = 1) -> str:
        """The report as text: the ``top`` sites, each with up to ``frames`` frames."""
        if not self.blocks:
            return "no outstanding allocations"
        lines = [
            f"{self.blocks} outstanding allocation(s), {format_size(self.nbytes)} "
            f"({self.nbytes} bytes), from {len(self.sites)} site(s):"
        ]
        for entry in self.sites[:top]:
            lines.append(
                f"  {format_size(entry.nbytes):>10} in {entry.blocks:>5} block(s)  {entry.site}"
            )
            if frames > 1 and len(entry.stack) > 1:
                lines.append(format_stack(entry.stack[1:frames], indent=" " * 33 + "from "))
        if len(self.sites) > top:
            rest = self.sites[top:]
            lines.append(
                f"  ... {len(rest)} more site(s), {format_size(sum(s.nbytes for s in rest))}"
            )
        if not self.stacks:
            lines.append("  (stacks were off: Tracking(..., stack_depth=8) names the sites)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def group_by_site(allocations: Iterable[TrackedAllocation]) -> tuple[SiteReport, ...]:
    """Allocations grouped by stack (by size when a stack is empty), the most bytes first."""
    groups: dict[tuple[Stack, int | None], list[int]] = {}
    for item in allocations:
        key = (item.stack, None if item.stack else item.nbytes)
        entry = groups.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += item.nbytes
    reports = [SiteReport(stack, n, b, size) for (stack, size), (n, b) in groups.items()]
    reports.sort(key=lambda r: (-r.nbytes, -r.blocks, r.site))
    return tuple(reports)


def stack_statistics(resource: MemoryResource) -> tuple[str, object] | None:
    """``(layer name, statistics)`` of the first layer at or below ``resource`` whose
    ``statistics()`` speaks of reserved and allocated bytes (a pool, an upstream), or None."""
    for layer in resource_stack(resource):
        method = getattr(layer, "statistics", None)
        if callable(method):
            stats = method()
            if hasattr(stats, "reserved_bytes") and hasattr(stats, "allocated_bytes"):
                return type(layer).__name__, stats
    return None


class Tracking(ResourceAdaptor):
    """Wraps ``upstream`` and remembers every live allocation (with its stack, if asked)."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        stack_depth: int = 0,
        report_at_exit: bool = False,
    ) -> None:
        self._upstream = check_resource(upstream)
        self._depth = check_stack_depth(stack_depth)
        if type(report_at_exit) is not bool:
            raise InvalidArgumentError(f"report_at_exit must be a bool, got {report_at_exit!r}")
        self._live: dict[int, tuple[int, int, int, Stack]] = {}
        # One counter numbers allocations and marks alike: next() on it is atomic, so a mark
        # is above every number already given and below every later one, however threads
        # interleave (a separate "next number" field, written after the count, could go back
        # by one when two threads allocated at once, and mark() then came out one too low).
        self._sequence = itertools.count()
        if report_at_exit:
            atexit.register(_report_at_exit, weakref.ref(self))

    @property
    def stack_depth(self) -> int:
        """Frames kept per allocation (0: none)."""
        return self._depth

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate``, remembered once it succeeded (an OOM is explained)."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        try:
            address = self._upstream.allocate(nbytes, alignment, stream)
        except OutOfMemoryError as exc:
            self._explain(exc)
            raise
        stack = capture(self._depth) if self._depth else ()
        sequence = next(self._sequence)
        self._live[address] = (nbytes, alignment, sequence, stack)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``upstream.deallocate``; the allocation is forgotten once it succeeded."""
        if type(address) is not int:
            address = check_address(address)
        entry = self._live.pop(address, None)
        try:
            self._upstream.deallocate(address, nbytes, stream)
        except BaseException:
            if entry is not None:
                self._live[address] = entry
            raise

    # --- queries -----------------------------------------------------------------------------

    def mark(self) -> int:
        """A point in the allocation order: ``outstanding(since=mark)`` lists only later ones.

        A mark takes a number of the allocation order itself, so sequence numbers skip one
        at each mark."""
        return next(self._sequence)

    def outstanding(self, *, since: int = 0) -> tuple[TrackedAllocation, ...]:
        """The live allocations (made at or after ``since``), oldest first."""
        items = [
            TrackedAllocation(address, nbytes, alignment, sequence, stack)
            for address, (nbytes, alignment, sequence, stack) in self._live.copy().items()
            if sequence >= since
        ]
        items.sort(key=lambda item: item.sequence)
        return tuple(items)

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        return {address: entry[0] for address, entry in self._live.copy().items()}

    def stack_of(self, address: int) -> Stack | None:
        """The stack recorded for the live block at ``address`` (``()`` if stacks were off),
        or None when no live block starts there."""
        entry = self._live.get(address)
        return None if entry is None else entry[3]

    @property
    def live_bytes(self) -> int:
        """Bytes requested by the live allocations."""
        return sum(entry[0] for entry in self._live.copy().values())

    def __len__(self) -> int:
        return len(self._live)

    def report(self, *, since: int = 0) -> LeakReport:
        """The live allocations (made at or after ``since``) grouped by site."""
        items = self.outstanding(since=since)
        return LeakReport(
            blocks=len(items),
            nbytes=sum(item.nbytes for item in items),
            sites=group_by_site(items),
            stacks=self._depth > 0,
        )

    def __repr__(self) -> str:
        return (
            f"Tracking({self._upstream!r}, live={len(self._live)}, "
            f"live_bytes={format_size(self.live_bytes)}, stack_depth={self._depth})"
        )

    # --- out of memory -----------------------------------------------------------------------

    def _explain(self, exc: OutOfMemoryError) -> None:
        """Add the live allocation sites and the stack's reserved/allocated/fragmentation
        figures to ``exc``'s message (once, however many trackers it passes)."""
        if getattr(exc, "_tensorarena_tracked", False):
            return
        report = self.report()
        lines = [f"live through {type(self).__name__}: " + (
            report.format(top=5).replace("\n", "\n  ") if report else "nothing")]
        found = stack_statistics(self._upstream)
        if found is not None:
            name, stats = found
            reserved = stats.reserved_bytes.current  # type: ignore[attr-defined]
            allocated = stats.allocated_bytes.current  # type: ignore[attr-defined]
            fragmentation = getattr(stats, "fragmentation", 0.0)
            lines.append(
                f"{name} below: reserved {format_size(reserved)}, allocated "
                f"{format_size(allocated)} (reserved but unallocated "
                f"{format_size(reserved - allocated)}), fragmentation {fragmentation:.1%}"
            )
        exc.detail = (exc.detail + "\n" if exc.detail else "") + "\n".join(lines)
        exc._tensorarena_tracked = True  # type: ignore[attr-defined]


def _report_at_exit(reference: weakref.ref[Tracking]) -> None:
    tracker = reference()
    if tracker is None:
        return
    report = tracker.report()
    if report:
        warnings.warn(
            f"allocations still live at exit through {tracker!r}:\n{report.format(frames=4)}",
            LeakWarning,
            stacklevel=1,
        )
