"""``Poisoning``: freed blocks are filled with a pattern and held in quarantine; a block whose
poison changed before it is handed out again was written after its free.

A free does not go upstream at once. The block is filled with ``pattern`` and queued in a FIFO
*quarantine* (AddressSanitizer's idea): while it waits there nobody else can be given its bytes,
so any change to them is a write through a stale pointer — an array or view kept past its free.
A block leaves the quarantine, oldest first, when the quarantine holds more than ``quarantine``
bytes or ``max_blocks`` blocks; its poison is verified then, just before the upstream can hand
its bytes out again, and a changed byte raises :class:`~tensorarena.errors.UseAfterFreeError`
naming the block, the first written offset, where it was freed and where it was allocated.
:meth:`Poisoning.check` verifies the whole quarantine on demand, :meth:`Poisoning.flush`
verifies and releases it all (a :class:`~tensorarena.memory.Pool` below refuses ``reset()``
while blocks wait here, as it does for a thread cache's).

The quarantine holds memory that a plain free would have given back, so the upstream can run
out sooner: when it refuses a request, the quarantine is flushed and the request retried once
(as PyTorch empties its cache and retries). A larger quarantine catches writes that come later;
a block larger than the whole quarantine is verified and released as soon as the next free
arrives.

``fill_new`` (off by default) also fills every new block with a byte, so reads of memory the
program never wrote show a recognisable value instead of the last user's data (mimalloc's debug
builds fill 0xD0 on allocation and 0xDF on free; MSVC's 0xCD and 0xDD). Filling costs a
``memset`` of the block on every call, which is the price of this adaptor.

A corruption is reported once, and the call that found it changes nothing else (the rule of
every error here): the blocks a call would release are verified *before* anything changes, and
a damaged block is poisoned again when it is reported, so the same call, repeated, goes through.
Every corruption found is also kept in :attr:`Poisoning.corruptions`, so a report raised where
nobody can catch it (a free in an array's finalizer) is not lost.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass

from tensorarena.adaptors._bytes import (
    check_pattern,
    differences,
    fill,
    intact,
    require_host_memory,
)
from tensorarena.adaptors.sites import Stack, capture, format_site, format_stack
from tensorarena.adaptors.tracking import check_stack_depth
from tensorarena.errors import (
    DoubleFreeError,
    InvalidArgumentError,
    SizeMismatchError,
    UseAfterFreeError,
)
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import MAX_SIZE, Size, check_address, check_nbytes, format_size, parse_size

__all__ = ["Poisoning", "PoisoningStatistics"]

#: MSVC's debug heap fills freed memory with 0xDD ("dead").
DEFAULT_PATTERN = 0xDD
#: Most corruptions kept in :attr:`Poisoning.corruptions` (the oldest are dropped after).
_KEPT = 100


@dataclass(frozen=True, slots=True)
class PoisoningStatistics:
    """A snapshot of a :class:`Poisoning` adaptor."""

    live_blocks: int  #: handed out and not freed
    quarantined_blocks: int  #: freed, poisoned, waiting in quarantine
    quarantined_bytes: int
    blocks_verified: int  #: quarantined blocks whose poison was checked
    corruptions: int  #: writes after free found so far
    num_alloc_retries: int = 0  #: requests served after flushing the quarantine


class Poisoning(ResourceAdaptor):
    """Wraps ``upstream`` (host memory): poisons freed blocks and quarantines them."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        pattern: int = DEFAULT_PATTERN,
        quarantine: Size = "16MiB",
        max_blocks: int = 4096,
        fill_new: int | None = None,
        stack_depth: int = 1,
    ) -> None:
        self._upstream = check_resource(upstream)
        require_host_memory(self._upstream, "Poisoning")
        self._pattern = check_pattern(pattern)
        self._fill_new = None if fill_new is None else check_pattern(fill_new, name="fill_new")
        self._max_bytes = parse_size(quarantine, name="quarantine", allow_zero=True)
        if type(max_blocks) is not int or max_blocks < 0:
            raise InvalidArgumentError(f"max_blocks must be a non-negative int, got {max_blocks!r}")
        self._max_blocks = max_blocks
        self._depth = check_stack_depth(stack_depth)
        self._lock = threading.RLock()
        self._live: dict[int, tuple[int, int, Stack]] = {}  # address -> (nbytes, align, stack)
        # Oldest first: address -> (nbytes, alignment, allocated at, freed at, stream).
        self._quarantine: OrderedDict[int, tuple[int, int, Stack, Stack, Stream]] = OrderedDict()
        self._quarantined_bytes = 0
        self._verified = 0
        self._retries = 0
        #: The corruptions found so far (the last 100), newest last.
        self.corruptions: list[UseAfterFreeError] = []
        self._found = 0

    @property
    def pattern(self) -> int:
        """The poison byte written over freed blocks."""
        return self._pattern

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """``upstream.allocate`` (after flushing the quarantine once if it is out of memory)."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        try:
            address = self._upstream.allocate(nbytes, alignment, stream)
        except MemoryError:
            with self._lock:
                if not self._quarantine:
                    raise
                self._verify_oldest(len(self._quarantine))
                self._release_oldest(len(self._quarantine))
                self._retries += 1
            address = self._upstream.allocate(nbytes, alignment, stream)
        if self._fill_new is not None:
            fill(address, nbytes, self._fill_new)
        stack = capture(self._depth) if self._depth else ()
        with self._lock:
            self._live[address] = (nbytes, alignment, stack)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Poison the block and quarantine it; the oldest blocks leave (verified, released
        upstream) while the quarantine is over its bounds."""
        if type(address) is not int:
            address = check_address(address)
        with self._lock:
            entry = self._live.get(address)
            if entry is None:
                waiting = self._quarantine.get(address)
                if waiting is not None:
                    raise DoubleFreeError(
                        f"Poisoning: double free: block at {address:#x} "
                        f"({waiting[0]} bytes) was already freed at {format_site(waiting[3])}",
                        address=address,
                    )
                # Not ours: the upstream decides (it may have handed it out before we wrapped
                # it) and raises the precise error if it is not live there either.
                self._upstream.deallocate(address, nbytes, stream)
                return
            if type(nbytes) is not int:
                nbytes = check_nbytes(nbytes)
            if nbytes != entry[0]:
                raise SizeMismatchError(
                    f"Poisoning: block at {address:#x} was allocated with {entry[0]} bytes, "
                    f"deallocated with {nbytes}",
                    address=address,
                    given=nbytes,
                    allocated=entry[0],
                )
            leaving = self._over_bounds(nbytes, 1)
            self._verify_oldest(leaving)  # raises before anything changed
            freed_at = capture(self._depth) if self._depth else ()
            fill(address, nbytes, self._pattern)
            del self._live[address]
            self._quarantine[address] = (nbytes, entry[1], entry[2], freed_at, stream)
            self._quarantined_bytes += nbytes
            self._release_oldest(leaving)
            # Still over: the new block alone is larger than the quarantine; it was just
            # poisoned, so it leaves unverified.
            self._release_oldest(self._over_bounds(0, 0))

    # --- the quarantine ----------------------------------------------------------------------

    def check(self) -> int:
        """Verify the poison of every quarantined block; return how many, or raise
        :class:`UseAfterFreeError` for the first (oldest) one written after its free."""
        with self._lock:
            self._verify_oldest(len(self._quarantine))
            return len(self._quarantine)

    def flush(self) -> int:
        """Verify every quarantined block, then release them all upstream; return the bytes
        released. A written block raises :class:`UseAfterFreeError` first (nothing released:
        call again to release them)."""
        with self._lock:
            released = self._quarantined_bytes
            self._verify_oldest(len(self._quarantine))
            self._release_oldest(len(self._quarantine))
            return released

    def _over_bounds(self, extra_bytes: int, extra_blocks: int) -> int:
        """How many of the oldest quarantined blocks must leave for the quarantine, plus
        ``extra_bytes`` in ``extra_blocks`` new blocks, to be within its bounds."""
        nbytes = self._quarantined_bytes + extra_bytes
        count = len(self._quarantine) + extra_blocks
        leaving = 0
        for entry in self._quarantine.values():
            if nbytes <= self._max_bytes and count <= self._max_blocks:
                break
            nbytes -= entry[0]
            count -= 1
            leaving += 1
        return leaving

    def _verify_oldest(self, count: int) -> None:
        """Verify the ``count`` oldest quarantined blocks; raise for the first one written."""
        if not count:
            return
        for address, entry in itertools.islice(self._quarantine.items(), count):
            error = self._verify(address, entry)
            if error is not None:
                raise error

    def _release_oldest(self, count: int) -> None:
        """Give the ``count`` oldest quarantined blocks back upstream (verified already)."""
        quarantine = self._quarantine
        for _ in range(count):
            address, entry = next(iter(quarantine.items()))
            # Given back before it leaves our books: if the upstream refuses, it stays here.
            self._upstream.deallocate(address, entry[0], entry[4])
            del quarantine[address]
            self._quarantined_bytes -= entry[0]

    def _verify(
        self, address: int, entry: tuple[int, int, Stack, Stack, Stream]
    ) -> UseAfterFreeError | None:
        """The error for a written quarantined block, or None; a written block is poisoned
        again, so that each corruption is reported once (the lock is held)."""
        nbytes, _, allocated_at, freed_at, _ = entry
        self._verified += 1
        if intact(address, nbytes, self._pattern):
            return None
        count, offset, _ = differences(address, nbytes, self._pattern)
        fill(address, nbytes, self._pattern)
        message = (
            f"use after free: {count} byte(s) of the freed {nbytes}-byte block at {address:#x} "
            f"were written after it was freed; the first at offset {offset} (poison pattern "
            f"{self._pattern:#04x}); freed at {format_site(freed_at)}, allocated at "
            f"{format_site(allocated_at)}"
        )
        if len(freed_at) > 1:
            message += "\nfreed at:\n" + format_stack(freed_at)
        error = UseAfterFreeError(
            message,
            freed_at=format_stack(freed_at) if freed_at else "",
            address=address,
            nbytes=nbytes,
            offset=offset,
            corrupted=count,
            pattern=self._pattern,
            site=format_stack(allocated_at) if allocated_at else "",
        )
        self._found += 1
        self.corruptions.append(error)
        del self.corruptions[:-_KEPT]
        return error

    # --- queries -----------------------------------------------------------------------------

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks (handed out, not freed): address → requested bytes."""
        with self._lock:
            return {address: entry[0] for address, entry in self._live.items()}

    def stack_of(self, address: int) -> Stack | None:
        """The allocation stack of the live block at ``address``, or None."""
        entry = self._live.get(address)
        return None if entry is None else entry[2]

    def statistics(self) -> PoisoningStatistics:
        """A frozen snapshot of the adaptor's counters."""
        with self._lock:
            return PoisoningStatistics(
                live_blocks=len(self._live),
                quarantined_blocks=len(self._quarantine),
                quarantined_bytes=self._quarantined_bytes,
                blocks_verified=self._verified,
                corruptions=self._found,
                num_alloc_retries=self._retries,
            )

    def __repr__(self) -> str:
        return (
            f"Poisoning({self._upstream!r}, live={len(self._live)}, "
            f"quarantined={len(self._quarantine)} ({format_size(self._quarantined_bytes)}) "
            f"of {format_size(self._max_bytes)})"
        )
