"""``Guarded``: red zones around every block, checked on free and on demand; optional guard pages.

Each request of ``nbytes`` takes a larger block from the upstream and hands out the middle of
it. The bytes before and after the user's block (the *red zones*) are filled with a recorded
canary ``pattern``; a write one byte past the end, or one byte before the start, changes a
canary. Every free checks both zones, and :meth:`Guarded.check` checks every live block, raising
:class:`~tensorarena.errors.BufferOverflowError` that names the block, the side (``overflow``
or ``underflow``), the first corrupted offset from the block's start (``nbytes`` for one byte
past the end, ``-1`` for the byte before the start) and where the block was allocated.

Layout. The front zone is ``redzone`` bytes rounded up to the request's alignment, so the user's
address keeps the alignment it asked for (a 2 MiB-aligned request costs a 2 MiB front zone; the
whole front zone is canary). The back zone is ``redzone`` bytes, right after the block's last
byte, so there is no unchecked slack between the block and its canary.

Guard pages (``guard_pages=True``, Linux): as Electric Fence does, the block is placed to end
where a page begins, and that page is ``mprotect``'ed ``PROT_NONE``: the first write past the
end faults *at the writing instruction* and the process stops there (with ``faulthandler`` on,
Python prints the line), instead of being found later at the free. Where the alignment leaves
slack between the block's end and the page, the slack is canary, checked on free like a red
zone. It costs at least two pages per block, so it is for hunting a bug, not for running a job.
The upstream must hand out memory nothing else shares a page with at page alignment, as every
resource does when asked for whole pages aligned to a page (pools, ``HostMemory``).

A corrupted zone is reported once, and the call that found it changes nothing else (the rule of
every error here): the free that finds it raises *before* it frees, after writing the canary
back, so the block is still live and the same free, repeated, goes through; ``check()`` re-arms
the zone in the same way. Every corruption found is also kept in :attr:`Guarded.corruptions`:
a free that runs in an array's finalizer can only print its error, and the report must not be
lost there (the block then stays live, and a :class:`~tensorarena.adaptors.Tracking` adaptor
above lists it as outstanding). Frees of addresses that are not live blocks of this
adaptor are refused before anything changes, as every resource refuses them.
"""

from __future__ import annotations

import sys
import threading
from ctypes import memset
from dataclasses import dataclass
from typing import NamedTuple

from tensorarena.adaptors._bytes import (
    PAGE_SIZE,
    PROT_NONE,
    PROT_READ_WRITE,
    check_pattern,
    differences,
    fill,
    intact,
    mprotect,
    require_host_memory,
)
from tensorarena.adaptors.sites import Stack, capture, format_site, format_stack
from tensorarena.adaptors.tracking import check_stack_depth
from tensorarena.errors import (
    BufferOverflowError,
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    SizeMismatchError,
)
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.sizes import (
    ALIGNMENTS,
    MAX_SIZE,
    Size,
    align_up,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)

__all__ = ["Guarded", "GuardedStatistics"]

#: MSVC's debug heap calls the bytes around a block "no man's land" and fills them with 0xFD.
DEFAULT_PATTERN = 0xFD
#: Freed addresses remembered to call a second free a double free (not a foreign address).
_RECENT_FREES = 4096
#: Most corruptions kept in :attr:`Guarded.corruptions` (the oldest are dropped after).
_KEPT = 100


@dataclass(frozen=True, slots=True)
class GuardedStatistics:
    """A snapshot of a :class:`Guarded` adaptor."""

    live_blocks: int
    live_bytes: int  #: bytes the callers asked for
    guard_bytes: int  #: what the red zones and guard pages of the live blocks take on top
    blocks_checked: int  #: red-zone checks made (on free and by check())
    corruptions: int  #: corrupted blocks found so far


class _Block(NamedTuple):
    """A live block's layout (a tuple: made on every allocate, and a frozen dataclass's
    ``__init__`` costs several times as much)."""

    base: int  #: the upstream block
    total: int
    nbytes: int
    front: int  #: bytes of canary before the user's block
    back: int  #: bytes of canary after it (up to the guard page, if any)
    guard: int  #: address of the protected page after the block, 0 without one
    stack: Stack


class Guarded(ResourceAdaptor):
    """Wraps ``upstream`` (host memory) and surrounds every block with canary red zones."""

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        redzone: Size = 64,
        pattern: int = DEFAULT_PATTERN,
        guard_pages: bool = False,
        stack_depth: int = 1,
    ) -> None:
        self._upstream = check_resource(upstream)
        require_host_memory(self._upstream, "Guarded")
        self._redzone = parse_size(redzone, name="redzone")
        self._pattern = check_pattern(pattern)
        if type(guard_pages) is not bool:
            raise InvalidArgumentError(f"guard_pages must be a bool, got {guard_pages!r}")
        if guard_pages and not sys.platform.startswith("linux"):
            raise InvalidArgumentError("guard_pages=True needs Linux (mprotect)")
        self._guard_pages = guard_pages
        self._depth = check_stack_depth(stack_depth)
        self._lock = threading.Lock()
        self._live: dict[int, _Block] = {}
        self._recent: dict[int, None] = {}  # insertion-ordered: the oldest first
        self._overhead = 0
        self._live_bytes = 0
        self._checked = 0
        self._corruptions = 0
        #: The corruptions found so far (the last 100), newest last.
        self.corruptions: list[BufferOverflowError] = []

    @property
    def redzone(self) -> int:
        """The least number of canary bytes on each side of a block."""
        return self._redzone

    @property
    def pattern(self) -> int:
        """The canary byte."""
        return self._pattern

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """A block of ``nbytes`` between two red zones (and before a guard page, if on)."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        if type(alignment) is not int or alignment not in ALIGNMENTS:
            alignment = check_alignment(alignment)
        stack = capture(self._depth) if self._depth else ()
        if self._guard_pages:
            data = align_up(self._redzone + nbytes + alignment - 1, PAGE_SIZE)
            total = data + PAGE_SIZE
            base = self._upstream.allocate(total, max(alignment, PAGE_SIZE), stream)
            guard = base + data
            address = (guard - nbytes) & -alignment
            front, back = address - base, guard - address - nbytes
        else:
            front = (self._redzone + alignment - 1) & -alignment
            back = self._redzone
            total = front + nbytes + back
            base = self._upstream.allocate(total, alignment, stream)
            address = base + front
            guard = 0
        try:
            memset(base, self._pattern, front)
            if back:
                memset(address + nbytes, self._pattern, back)
            if guard:
                mprotect(guard, PAGE_SIZE, PROT_NONE)
        except BaseException:
            self._upstream.deallocate(base, total, stream)
            raise
        block = _Block(base, total, nbytes, front, back, guard, stack)
        with self._lock:
            self._live[address] = block
            self._recent.pop(address, None)
            self._overhead += total - nbytes
            self._live_bytes += nbytes
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Check the block's red zones and give it back upstream; raise
        :class:`BufferOverflowError` instead, the block still live, if a zone was corrupted."""
        if type(address) is not int:
            address = check_address(address)
        with self._lock:
            block = self._live.get(address)
            if block is None:
                raise self._not_live(address)
            if type(nbytes) is not int:
                nbytes = check_nbytes(nbytes)
            if nbytes != block.nbytes:
                raise SizeMismatchError(
                    f"Guarded: block at {address:#x} was allocated with {block.nbytes} bytes, "
                    f"deallocated with {nbytes}",
                    address=address,
                    given=nbytes,
                    allocated=block.nbytes,
                )
            error = self._verify(address, block)
            if error is not None:
                raise error
            del self._live[address]
            self._overhead -= block.total - nbytes
            self._live_bytes -= nbytes
        try:
            if block.guard:
                mprotect(block.guard, PAGE_SIZE, PROT_READ_WRITE)
            self._upstream.deallocate(block.base, block.total, stream)
        except BaseException:
            with self._lock:  # the free failed: the block is live again, as it was
                if block.guard:
                    mprotect(block.guard, PAGE_SIZE, PROT_NONE)
                self._live[address] = block
                self._overhead += block.total - nbytes
                self._live_bytes += nbytes
            raise
        with self._lock:
            self._recent[address] = None
            if len(self._recent) > _RECENT_FREES:
                del self._recent[next(iter(self._recent))]

    # --- checks ------------------------------------------------------------------------------

    def check(self, address: int | None = None) -> int:
        """Check the red zones of every live block (or of the one at ``address``); return how
        many were checked, or raise :class:`BufferOverflowError` for the first corrupted one
        (whose zones are re-armed: the next check reports only new damage)."""
        with self._lock:  # held throughout: a concurrent free must not unmap a block we read
            if address is None:
                blocks = list(self._live.items())
            else:
                address = check_address(address)
                if address not in self._live:
                    raise self._not_live(address)
                blocks = [(address, self._live[address])]
            for start, block in blocks:
                error = self._verify(start, block)
                if error is not None:
                    raise error
            return len(blocks)

    def _verify(self, address: int, block: _Block) -> BufferOverflowError | None:
        """The error for ``block``'s corrupted zones, or None; a corrupted block's zones are
        written again, so that each corruption is reported once (the lock is held)."""
        self._checked += 1
        pattern = self._pattern
        if intact(block.base, block.front, pattern) and intact(
            address + block.nbytes, block.back, pattern
        ):
            return None
        before = differences(block.base, block.front, pattern)
        after = differences(address + block.nbytes, block.back, pattern)
        self._corruptions += 1
        if after[0]:  # an overflow is the likelier bug: report it first
            side, count, offset = "overflow", after[0], block.nbytes + after[1]
            where = f"{offset - block.nbytes + 1} byte(s) past its end"
        else:
            side, count, offset = "underflow", before[0], before[2] - block.front
            where = f"{-offset} byte(s) before its start"
        also = ""
        if before[0] and after[0]:
            also = f" (and {before[0]} byte(s) before its start)"
        fill(block.base, block.front, self._pattern)
        fill(address + block.nbytes, block.back, self._pattern)
        site = format_stack(block.stack) if block.stack else ""
        message = (
            f"buffer {side}: {count} canary byte(s) around the {block.nbytes}-byte block at "
            f"{address:#x} were overwritten{also}; the first corrupted byte is at offset "
            f"{offset}, {where} (red-zone pattern {self._pattern:#04x}); allocated at "
            f"{format_site(block.stack)}"
        )
        if len(block.stack) > 1:
            message += "\n" + site
        error = BufferOverflowError(
            message,
            side=side,
            address=address,
            nbytes=block.nbytes,
            offset=offset,
            corrupted=count,
            pattern=self._pattern,
            site=site,
        )
        self.corruptions.append(error)
        del self.corruptions[:-_KEPT]
        return error

    # --- queries -----------------------------------------------------------------------------

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return {address: block.nbytes for address, block in self._live.items()}

    def stack_of(self, address: int) -> Stack | None:
        """The allocation stack of the live block at ``address``, or None."""
        block = self._live.get(address)
        return None if block is None else block.stack

    def statistics(self) -> GuardedStatistics:
        """A frozen snapshot of the adaptor's counters."""
        with self._lock:
            return GuardedStatistics(
                live_blocks=len(self._live),
                live_bytes=self._live_bytes,
                guard_bytes=self._overhead,
                blocks_checked=self._checked,
                corruptions=self._corruptions,
            )

    def __repr__(self) -> str:
        mode = ", guard_pages=True" if self._guard_pages else ""
        return (
            f"Guarded({self._upstream!r}, redzone={self._redzone}{mode}, "
            f"live={len(self._live)}, guard_bytes={format_size(self._overhead)})"
        )

    def _not_live(self, address: int) -> InvalidAddressError:
        if address in self._recent:
            return DoubleFreeError(
                f"Guarded: double free: block at {address:#x} was already freed",
                address=address,
            )
        return InvalidAddressError(
            f"Guarded: address {address:#x} is not a live block of this adaptor (never "
            "allocated through it, freed long ago, or not the start of a block)",
            address=address,
        )
