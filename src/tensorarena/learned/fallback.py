"""The memory of :class:`~tensorarena.learned.LearnedPlans` that no plan serves: segregated, so
that a block made in a recorded step and kept past it pins only its own bytes.

A first step makes lasting state among its temporaries: an optimizer's moments, a cache. They
are the blocks that outlive the recorded step, and nothing tells them apart when they are
allocated. In one growing pool, best fit puts each into a hole among the step's temporaries;
the temporaries die, and the state pins arenas several times its size for the rest of the run,
beside the plan's arena (the pool cannot move a live tensor's bytes). Here:

* a **large** block (``threshold`` bytes or more, or whole pages) gets a region of its own
  from the upstream, its size rounded up to a page (what a host upstream really maps, so the
  reserved bytes are honest), given back the moment it is freed: lasting or not, it costs its
  own bytes and never holds a hole open;
* a **small** block comes from a pool (``strategy``, default best fit) for its class of sizes,
  tiny (under 1 KiB) or small: a lasting scalar never pins an arena made for a larger block.
  The pools' arenas double what the pool holds, up to ``chunk`` bytes, so a lasting small block
  pins at most one small arena, and a program that keeps one tiny block keeps a tiny arena.

The price is a call to the upstream per large block that falls back (the first step's, and what
a plan does not serve later), which a served step does not pay.
"""

from __future__ import annotations

from collections import OrderedDict

from tensorarena.core.registry import StrategySpec
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    ResourceClosedError,
)
from tensorarena.memory.growth import Doubling
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource
from tensorarena.sizes import format_size

__all__ = ["FALLBACK_CHUNK", "FALLBACK_THRESHOLD", "SegregatedFallback"]

#: Blocks of this many bytes or more get a region of their own.
FALLBACK_THRESHOLD = 16 * 1024
#: The largest arena of a small blocks' pool.
FALLBACK_CHUNK = 8 * 1024
#: Small blocks below this size have pools of their own.
_TINY = 1024
#: Freed addresses remembered, to tell a second free of one from a foreign address.
_FREED_REMEMBERED = 4096
#: Large regions are whole pages: what a host upstream maps for them.
_GRANULARITY = 4096
#: The largest alignment a small block may ask for (more: a region of its own).
_CHUNK_ALIGNMENT = 4096


class SegregatedFallback:
    """Large blocks in regions of their own, small ones in pools of small arenas, one pool per
    class of sizes (module docstring). Not thread-safe: its owner holds a lock around every
    call."""

    def __init__(self, upstream: MemoryResource, *, strategy: StrategySpec = "best_fit",
                 threshold: int = FALLBACK_THRESHOLD, chunk: int = FALLBACK_CHUNK,
                 granularity: int = _GRANULARITY) -> None:
        for name, value in (("threshold", threshold), ("chunk", chunk),
                            ("granularity", granularity)):
            if type(value) is not int or value < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
        self._upstream = upstream
        self._threshold = threshold
        self._granularity = granularity
        # One pool per class of small sizes: a tiny lasting block (a scalar, a norm's bias)
        # never lands in, and pins, an arena made for a larger one.
        self._classes = tuple(
            (limit, Pool(upstream, strategy=strategy, initial_size=0, thread_safe=False,
                         growth=Doubling(chunk)))
            for limit in (_TINY, threshold))
        self._owner: dict[int, Pool] = {}  # small block -> its pool
        self._large: dict[int, int] = {}  # address -> bytes taken from the upstream
        # The addresses freed last, to name a second free of one (a region is unmapped at once)
        self._freed: OrderedDict[int, None] = OrderedDict()
        self._closed = False
        # A small block came or went since the last trim: only then can an arena be empty
        # that was not (a learned step's marker trims, and a served step touches no pool).
        self._touched = False

    def allocate(self, nbytes: int, alignment: int) -> int:
        """``nbytes`` bytes aligned to ``alignment`` (the caller checked both); the upstream's
        MemoryError goes on and nothing changes."""
        if self._closed:
            raise ResourceClosedError(f"this fallback memory was closed ({self!r})")
        granularity = self._granularity
        if (nbytes < self._threshold and nbytes % granularity
                and alignment <= _CHUNK_ALIGNMENT):
            pool = next(p for limit, p in self._classes if nbytes < limit)
            address = pool.allocate(nbytes, alignment)
            self._owner[address] = pool
            self._touched = True
        else:
            size = -(-nbytes // granularity) * granularity
            address = self._upstream.allocate(size, alignment)
            self._large[address] = size
        self._freed.pop(address, None)
        return address

    def deallocate(self, address: int, nbytes: int) -> None:
        """Free a live block (the caller checked address and size)."""
        size = self._large.pop(address, None)
        if size is None:
            self._owner.pop(address).deallocate(address, nbytes)
            self._touched = True
        else:
            self._upstream.deallocate(address, size)
        freed = self._freed
        freed[address] = None
        if len(freed) > _FREED_REMEMBERED:
            freed.popitem(last=False)

    def trim(self) -> int:
        """Give every empty small arena back to the upstream; return the bytes released
        (nothing to do when no small block came or went since the last trim)."""
        if not self._touched:
            return 0
        self._touched = False
        return sum(p.trim() for _, p in self._classes)

    def close(self) -> None:
        """Take no new requests; small arenas go back once empty (large regions go back with
        their block, as always)."""
        self._closed = True
        for _, pool in self._classes:
            pool.close()

    @property
    def reserved_bytes(self) -> int:
        """What is held from the upstream now: the small arenas and the large regions."""
        return (sum(p.statistics().reserved_bytes.current for _, p in self._classes)
                + sum(self._large.values()))

    def size_of(self, address: int) -> int:
        """The requested size of a live small block, or the bytes of a large region. Else
        :class:`DoubleFreeError` for an address freed lately, :class:`InvalidAddressError`
        for any other."""
        size = self._large.get(address)
        if size is not None:
            return size
        if address in self._freed:
            raise DoubleFreeError(
                f"address {address:#x} was a block of the learned plans' fallback memory and "
                "is freed already: freed twice?", address=address)
        pool = self._owner.get(address)
        if pool is not None:
            return pool.size_of(address)
        raise InvalidAddressError(
            f"address {address:#x} is not a live block of the learned plans' fallback memory",
            address=address)

    def __len__(self) -> int:
        return len(self._owner) + len(self._large)

    def __repr__(self) -> str:
        return (f"SegregatedFallback(upstream={type(self._upstream).__name__}, "
                f"large={len(self._large)}, small={len(self._owner)}, "
                f"reserved={format_size(self.reserved_bytes)})")
