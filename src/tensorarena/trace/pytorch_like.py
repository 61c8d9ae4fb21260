"""``PyTorchLike``: a resource whose policy follows PyTorch's CUDA caching allocator.

So that a user sees how a trace would behave under PyTorch's allocator, on any machine, this
resource re-implements the documented policy of ``c10/cuda/CUDACachingAllocator.cpp`` (native
backend, default settings: no ``max_split_size``, no expandable segments, no garbage-collection
threshold) over any upstream (:class:`~tensorarena.memory.VirtualMemory` by default):

* every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``), at least 512;
* rounded requests of at most 1 MiB (``kSmallSize``) use the *small* pool, larger ones the
  *large* pool; a block never moves between pools;
* a request takes the smallest free block of its pool on its stream that fits (best fit, ties to
  the lowest address) — freed blocks are reused only on the stream that allocated them;
* when none fits, a new segment is taken from the upstream (``cudaMalloc``): 2 MiB for the small
  pool (``kSmallBuffer``), 20 MiB for requests up to 10 MiB (``kLargeBuffer``), else the request
  rounded up to 2 MiB (``kRoundLarge``);
* a block is split when what remains is at least 512 bytes (small pool) or more than 1 MiB
  (large pool); otherwise the caller gets the whole block (its ``allocated`` bytes say so);
* a freed block merges with free neighbours of its segment; segments go back to the upstream
  only on :meth:`empty_cache` (or when the upstream refuses a new segment: then every fully free
  segment is released and the request retried once, as ``release_cached_blocks`` does).

Statistics speak :mod:`tensorarena.stats`: *requested* the callers' sizes, *allocated* the blocks
handed out (rounded, plus any unsplit remainder), *reserved* the segments. ``on_action``, when
given, is called with ``(action, address, nbytes, stream)`` for each ``segment_alloc``,
``segment_free``, ``alloc`` and ``free`` — the actions of PyTorch's memory snapshots,
with the sizes PyTorch records (the request for blocks, the segment size for segments) — which is
how :func:`tensorarena.trace.snapshot_of` draws a trace the way PyTorch would have placed it.
It is a simulation for the bookkeeping, not PyTorch's speed: its time per operation is Python's.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tensorarena.errors import DoubleFreeError, InvalidAddressError, SizeMismatchError
from tensorarena.memory.live_blocks import RECENT_FREES
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryResource,
    ResourceAdaptor,
    Stream,
    check_resource,
)
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.sizes import check_address, check_alignment, check_nbytes, format_size
from tensorarena.stats import Count, MemoryStatistics

__all__ = ["BlockState", "PyTorchLike", "SegmentState"]

MIN_BLOCK = 512  #: kMinBlockSize: every block is a multiple of this
SMALL_SIZE = 1 << 20  #: kSmallSize: the largest request served by the small pool
SMALL_BUFFER = 2 << 20  #: kSmallBuffer: the small pool's segment size
LARGE_BUFFER = 20 << 20  #: kLargeBuffer: the segment for requests of 1-10 MiB
MIN_LARGE_ALLOC = 10 << 20  #: kMinLargeAlloc: from here, a segment of the request's own size
ROUND_LARGE = 2 << 20  #: kRoundLarge: large segments are multiples of this

Action = Callable[[str, int, int, int], None]


@dataclass(frozen=True, slots=True)
class BlockState:
    """One block of a segment: ``requested`` is 0 for a free block."""

    address: int
    size: int
    requested: int
    allocated: bool


@dataclass(frozen=True, slots=True)
class SegmentState:
    """One segment (an upstream allocation) and its blocks, in address order."""

    address: int
    total_size: int
    stream: int
    small: bool
    blocks: tuple[BlockState, ...]


class _Block:
    __slots__ = ("address", "allocated", "next", "prev", "requested", "segment", "size",
                 "small", "stream")

    def __init__(self, address: int, size: int, segment: int, stream: int, small: bool) -> None:
        self.address = address
        self.size = size
        self.segment = segment
        self.stream = stream
        self.small = small
        self.requested = 0
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


def _stream_key(stream: Stream) -> int:
    """Streams as sortable ints: ``None`` is 0 (the default stream), a stream object its id."""
    if stream is None:
        return 0
    return stream if type(stream) is int else id(stream)


def round_size(nbytes: int) -> int:
    """A request as PyTorch rounds it: a multiple of 512, at least 512."""
    return max(MIN_BLOCK, (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK)


def segment_size(rounded: int) -> int:
    """The size of the segment PyTorch would ``cudaMalloc`` for a rounded request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class PyTorchLike(ResourceAdaptor):
    """PyTorch's caching-allocator policy over ``upstream`` (see the module docstring)."""

    def __init__(self, upstream: MemoryResource | None = None, *,
                 on_action: Action | None = None) -> None:
        self._upstream = VirtualMemory() if upstream is None else check_resource(upstream)
        self._on_action = on_action
        # Free blocks of each pool, as sorted (stream, size, address) keys; the blocks by address.
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._free_blocks: dict[int, _Block] = {}
        self._live: dict[int, _Block] = {}
        self._recent_frees: OrderedDict[int, None] = OrderedDict()  # to name a double free
        self._segments: dict[int, _Block] = {}  # base -> first block
        self._requested = self._peak_requested = self._total_requested = 0
        self._allocated = self._peak_allocated = self._total_allocated = 0
        self._reserved = self._peak_reserved = self._total_reserved = 0
        self._peak_blocks = self._total_blocks = self._peak_segments = 0
        self._segment_allocs = self._segment_frees = self._retries = self._ooms = 0
        self._free_bytes = 0

    # --- the resource protocol ---------------------------------------------------------------

    def allocate(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT,
                 stream: Stream = None) -> int:
        """A block of ``round_size(nbytes)`` bytes from the pool PyTorch would use.

        PyTorch's blocks are 512-byte aligned and its API takes no alignment; a larger one
        (which PyTorch never sees) is served from a block ``alignment - 512`` bytes larger whose
        leading part is split off as a free block.
        """
        nbytes = check_nbytes(nbytes)
        alignment = check_alignment(alignment)
        stream = _stream_key(stream)
        size = round_size(nbytes)
        pad = max(alignment - MIN_BLOCK, 0)
        small = size + pad <= SMALL_SIZE
        keys = self._free[small]
        index = bisect.bisect_left(keys, (stream, size + pad, 0))
        if index < len(keys) and keys[index][0] == stream:
            block = self._free_blocks.pop(keys.pop(index)[2])
            self._free_bytes -= block.size
        else:
            block = self._new_segment(size + pad, stream, small)
        lead = -block.address % alignment
        if lead:  # only for alignments above 512: split off the head, which stays free
            head, block = block, self._split(block, lead)
            self._insert_free(head)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            self._insert_free(self._split(block, size))
        block.allocated = True
        block.requested = nbytes
        self._live[block.address] = block
        self._recent_frees.pop(block.address, None)
        self._count_allocation(nbytes, block.size)
        if self._on_action is not None:
            self._on_action("alloc", block.address, nbytes, stream)
        return block.address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Give the block back to its pool, merged with its free neighbours."""
        address = check_address(address)
        block = self._live.get(address)
        if block is None:
            if address in self._recent_frees:
                raise DoubleFreeError(f"block {address:#x} was already freed", address=address)
            raise InvalidAddressError(
                f"address {address:#x} is not a live block of this allocator", address=address)
        nbytes = check_nbytes(nbytes)
        if nbytes != block.requested:
            raise SizeMismatchError(
                f"block {address:#x} was allocated with {block.requested} bytes, freed with "
                f"{nbytes}", address=address, given=nbytes, allocated=block.requested)
        del self._live[address]
        self._recent_frees[address] = None
        if len(self._recent_frees) > RECENT_FREES:
            self._recent_frees.popitem(last=False)
        self._requested -= block.requested
        self._allocated -= block.size
        if self._on_action is not None:
            self._on_action("free", address, block.requested, block.stream)
        block.allocated = False
        block.requested = 0
        after = block.next
        if after is not None and not after.allocated:
            self._remove_free(after)
            block.size += after.size
            block.next = after.next
            if after.next is not None:
                after.next.prev = block
        before = block.prev
        if before is not None and not before.allocated:
            self._remove_free(before)
            before.size += block.size
            before.next = block.next
            if block.next is not None:
                block.next.prev = before
            block = before
        self._insert_free(block)

    @staticmethod
    def _split(block: _Block, at: int) -> _Block:
        """Cut ``block`` after its first ``at`` bytes; return the new second part."""
        rest = _Block(block.address + at, block.size - at, block.segment, block.stream,
                      block.small)
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = at
        return rest

    # --- segments ----------------------------------------------------------------------------

    def _new_segment(self, size: int, stream: int, small: bool) -> _Block:
        wanted = segment_size(size)
        try:
            base = self._upstream.allocate(wanted, MIN_BLOCK, None)
        except MemoryError:
            if not self._release_free_segments():
                self._ooms += 1
                raise
            self._retries += 1
            try:
                base = self._upstream.allocate(wanted, MIN_BLOCK, None)
            except MemoryError:
                self._ooms += 1
                raise
        block = _Block(base, wanted, base, stream, small)
        self._segments[base] = block
        self._reserved += wanted
        self._total_reserved += wanted
        self._peak_reserved = max(self._peak_reserved, self._reserved)
        self._peak_segments = max(self._peak_segments, len(self._segments))
        self._segment_allocs += 1
        if self._on_action is not None:
            self._on_action("segment_alloc", base, wanted, stream)
        return block

    def empty_cache(self) -> int:
        """Give every fully free segment back to the upstream; return the bytes released."""
        return self._release_free_segments()

    def _release_free_segments(self) -> int:
        released = 0
        for base, block in list(self._segments.items()):
            if block.allocated or block.next is not None:
                continue
            self._upstream.deallocate(base, block.size, None)
            self._remove_free(block)
            del self._segments[base]
            self._reserved -= block.size
            self._segment_frees += 1
            released += block.size
            if self._on_action is not None:
                self._on_action("segment_free", base, block.size, block.stream)
        return released

    # --- bookkeeping -------------------------------------------------------------------------

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.stream, block.size, block.address))
        self._free_blocks[block.address] = block
        self._free_bytes += block.size

    def _remove_free(self, block: _Block) -> None:
        keys = self._free[block.small]
        del keys[bisect.bisect_left(keys, (block.stream, block.size, block.address))]
        del self._free_blocks[block.address]
        self._free_bytes -= block.size

    def _count_allocation(self, nbytes: int, size: int) -> None:
        self._requested += nbytes
        self._total_requested += nbytes
        self._peak_requested = max(self._peak_requested, self._requested)
        self._allocated += size
        self._total_allocated += size
        self._peak_allocated = max(self._peak_allocated, self._allocated)
        self._total_blocks += 1
        self._peak_blocks = max(self._peak_blocks, len(self._live))

    def segments(self) -> tuple[SegmentState, ...]:
        """Every segment with its blocks, in address order (what a snapshot's segments show)."""
        result = []
        for base in sorted(self._segments):
            first = self._segments[base]
            head: _Block | None = first
            blocks: list[BlockState] = []
            total = 0
            while head is not None:
                blocks.append(BlockState(head.address, head.size, head.requested, head.allocated))
                total += head.size
                head = head.next
            result.append(SegmentState(base, total, first.stream, first.small, tuple(blocks)))
        return tuple(result)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        self._peak_requested = self._requested
        self._peak_allocated = self._allocated
        self._peak_reserved = self._reserved
        self._peak_blocks = len(self._live)
        self._peak_segments = len(self._segments)

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot in the vocabulary of :mod:`tensorarena.stats`."""
        largest = max((key[1] for keys in self._free.values() for key in keys), default=0)
        split = sum(b.size for b in self._free_blocks.values()
                    if b.prev is not None or b.next is not None)
        allocated = Count(self._allocated, self._peak_allocated, self._total_allocated)
        return MemoryStatistics(
            requested_bytes=Count(self._requested, self._peak_requested, self._total_requested),
            allocated_bytes=allocated,
            active_bytes=allocated,
            reserved_bytes=Count(self._reserved, self._peak_reserved, self._total_reserved),
            allocations=Count(len(self._live), self._peak_blocks, self._total_blocks),
            segments=Count(len(self._segments), self._peak_segments, self._segment_allocs),
            inactive_split_bytes=split,
            free_bytes=self._free_bytes,
            largest_free_bytes=largest,
            free_extents=len(self._free_blocks),
            num_alloc_retries=self._retries,
            num_ooms=self._ooms,
            num_upstream_allocs=self._segment_allocs,
            num_upstream_frees=self._segment_frees,
        )

    def __repr__(self) -> str:
        return (f"PyTorchLike(upstream={type(self._upstream).__name__}, "
                f"segments={len(self._segments)}, reserved={format_size(self._reserved)}, "
                f"requested={format_size(self._requested)}, live={len(self._live)})")
