"""``NativePool``: one arena whose bookkeeping lives in C++, so ``use()`` serves it with no
Python call per allocation.

::

    pool = tensorarena.torch.NativePool(size="512MiB")             # one arena, best fit
    with tensorarena.torch.use(pool):                             # torch's CPU tensors from it:
        loss = model(x).sum(); loss.backward()                    # no Python call per tensor
    pool.statistics().allocated_bytes.peak                        # the same state, from Python

The pool takes one region of ``size`` bytes from ``upstream`` (default: a fresh
:class:`~tensorarena.memory.HostMemory` mapping) when it is made and carves it up in C++
(``_torch_cpu_native_pool.cpp``, built into torch's CPU allocator shim): blocks are whole
64-byte granules, placed by best fit (``strategy="best_fit"``: the smallest free extent that
holds the request, then the lowest address) or first fit (the lowest-addressed one), over free
extents kept by address and coalesced with their neighbours on free. It is an ordinary memory
resource too: :meth:`allocate`, :meth:`deallocate` and :meth:`statistics` call into the same
C++ state a route uses, so both views agree.

Under :func:`tensorarena.torch.use`, the route takes each block from the arena and frees it
back with no Python call (``tensorarena bench torch-use`` measures it: ``native-pool``). A
request the arena has no room for costs the route its one Python call, to :meth:`allocate`:
the ``fallback`` resource serves it if there is one (its blocks go back to it), else the pool
raises :class:`~tensorarena.errors.OutOfMemoryError`, which torch raises as
``torch.OutOfMemoryError``, as a full :class:`~tensorarena.memory.Pool` would. The pool never
grows.

Threads: every change is under one mutex in C++, so blocks may be freed from any thread, with
or without the GIL; after ``fork`` the child finds the pool consistent. Where torch's CPU shim
cannot be built (no torch, no compiler or ``ninja``), the same bookkeeping runs in Python
(:mod:`tensorarena.torch._native_pool_book`; ``native=False`` asks for it, ``native=True``
refuses to go without C++): the pool works alike, one Python call per routed allocation.

Ownership (RMM's rule): a live block's bytes are never handed out again. :meth:`close` takes no
new requests and gives the arena back once no block is live; a route to the pool keeps the pool
alive while any block it made lives, and the arena goes back when the pool is collected.
"""

from __future__ import annotations

import functools
import threading
import weakref
from types import TracebackType
from typing import Any, Literal

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidArgumentError,
    OutOfMemoryError,
    ResourceClosedError,
    ShimUnavailableError,
    SizeMismatchError,
)
from tensorarena.interop import torch_cpu_shim
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryKind,
    MemoryResource,
    Stream,
    check_resource,
)
from tensorarena.sizes import (
    MAX_SIZE,
    Size,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)
from tensorarena.stats import Count, MemoryStatistics
from tensorarena.torch import _native_pool_book as book

__all__ = ["NativePool", "Strategy"]

Strategy = Literal["best_fit", "first_fit"]
#: The alignment of the arena's base (a page): every request's alignment up to it is honoured.
ARENA_ALIGNMENT = 4096


def _give_back(upstream: MemoryResource, base: int, capacity: int) -> None:
    upstream.deallocate(base, capacity)


class NativePool:
    """One arena of ``size`` bytes from ``upstream``, kept in C++ (module docstring).

    ``strategy``: ``"best_fit"`` or ``"first_fit"``. ``fallback``: the resource that serves what
    the arena has no room for (``None``: such a request raises ``OutOfMemoryError``).
    ``native``: ``None`` keeps the books in C++ where torch's CPU shim can be built, in Python
    elsewhere; ``True`` requires C++ (:class:`~tensorarena.errors.ShimUnavailableError`);
    ``False`` keeps them in Python.
    """

    def __init__(self, upstream: MemoryResource | None = None, *, size: Size = "64MiB",
                 strategy: Strategy = "best_fit", fallback: MemoryResource | None = None,
                 native: bool | None = None) -> None:
        capacity = parse_size(size, name="size")
        if capacity > MAX_SIZE - book.GRANULE:
            raise InvalidArgumentError(f"size {format_size(capacity)} is too large")
        capacity = (capacity + book.GRANULE - 1) & -book.GRANULE
        if strategy not in ("best_fit", "first_fit"):
            raise InvalidArgumentError(
                f"strategy must be 'best_fit' or 'first_fit', got {strategy!r}")
        if native is not None and type(native) is not bool:
            raise InvalidArgumentError(f"native must be None, True or False, got {native!r}")
        if upstream is None:
            from tensorarena.memory.host import HostMemory

            upstream = HostMemory()
        upstream = check_resource(upstream)
        self._fallback = None if fallback is None else check_resource(fallback, name="fallback")
        shim: Any = None
        if native is not False:
            reason = torch_cpu_shim.unavailable()
            if reason and native:
                raise ShimUnavailableError(f"NativePool(native=True) needs torch's CPU allocator "
                                           f"shim, which cannot be built here: {reason}")
            shim = None if reason else torch_cpu_shim.extension()
        self._upstream, self._capacity, self._strategy = upstream, capacity, strategy
        base = int(upstream.allocate(capacity, ARENA_ALIGNMENT))
        try:
            if base % ARENA_ALIGNMENT:
                raise InvalidArgumentError(
                    f"upstream {type(upstream).__name__} returned {base:#x}, not aligned to "
                    f"{ARENA_ALIGNMENT} bytes")
            if shim is not None:
                self._capsule: Any = shim.native_pool_new(base, capacity, strategy == "first_fit")
                self._shim = shim
                self._take = functools.partial(shim.native_pool_allocate, self._capsule)
                self._give = functools.partial(shim.native_pool_deallocate, self._capsule)
                self._size_of = functools.partial(shim.native_pool_size_of, self._capsule)
                self._book: Any = None
            else:
                self._capsule = self._shim = None
                self._book = book.PythonBook(base, capacity, strategy == "first_fit")
                self._take, self._give = self._book.allocate, self._book.deallocate
                self._size_of = self._book.size_of
        except BaseException:
            upstream.deallocate(base, capacity)
            raise
        self._base = base
        self._lock = threading.Lock()  # the fallback's blocks
        self._fallen: dict[int, int] = {}  # fallback blocks: address -> nbytes
        self._fallbacks = [0, 0, 0]  # fallback blocks: current, peak, total
        self._closed = False
        self._released = weakref.finalize(self, _give_back, upstream, base, capacity)

    # --- what it is ----------------------------------------------------------------------------

    @property
    def memory_kind(self) -> MemoryKind:
        """The upstream's kind."""
        return self._upstream.memory_kind

    @property
    def upstream(self) -> MemoryResource:
        """Where the arena came from."""
        return self._upstream

    @property
    def fallback(self) -> MemoryResource | None:
        """What serves requests the arena has no room for, or ``None``."""
        return self._fallback

    @property
    def base(self) -> int:
        """The arena's address."""
        return self._base

    @property
    def capacity(self) -> int:
        """The arena's size in bytes (``size`` rounded up to 64)."""
        return self._capacity

    @property
    def strategy(self) -> Strategy:
        """``"best_fit"`` or ``"first_fit"``."""
        return self._strategy

    @property
    def native(self) -> bool:
        """Whether the books are kept in C++ (a route then takes blocks with no Python call)."""
        return self._capsule is not None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def served(self) -> int:
        """Blocks routes took from the arena with no Python call, so far."""
        return int(self._stats()[13])

    @property
    def fallbacks(self) -> Count:
        """Blocks the fallback served (live, peak, total)."""
        with self._lock:
            return Count(*self._fallbacks)

    # --- the resource protocol -----------------------------------------------------------------

    def allocate(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
                 ) -> int:
        """The address of ``nbytes`` bytes aligned to ``alignment``: from the arena, else from
        the fallback; :class:`~tensorarena.errors.OutOfMemoryError` where neither serves."""
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        if (type(alignment) is not int or not 0 < alignment <= MAX_SIZE
                or alignment & (alignment - 1)):
            alignment = check_alignment(alignment)
        if self._closed:
            raise ResourceClosedError(f"{self!r} is closed: it takes no new requests")
        address = self._take(nbytes, alignment)
        if address is not None:
            return address  # type: ignore[no-any-return]
        if self._fallback is None:
            stats = self._stats()
            raise OutOfMemoryError(nbytes, free=stats[9], largest_free=stats[10],
                                   capacity=self._capacity, allocated=stats[3],
                                   detail="a NativePool does not grow: give it a larger size, "
                                   "or a fallback= resource for what does not fit")
        address = int(self._fallback.allocate(nbytes, alignment, stream))
        with self._lock:
            self._fallen[address] = nbytes
            counts = self._fallbacks
            counts[0] += 1
            counts[1] = max(counts[0], counts[1])
            counts[2] += 1
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Free the block at ``address``, allocated with ``nbytes``. Raises
        :class:`~tensorarena.errors.DoubleFreeError` (not live: freed already),
        :class:`~tensorarena.errors.InvalidAddressError` (not a block of this pool, or a block
        a torch route took, which torch frees) or
        :class:`~tensorarena.errors.SizeMismatchError`, changing nothing."""
        if type(address) is not int or address < 0:
            address = check_address(address)
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        status = self._give(address, nbytes) if address < 1 << 64 else book.FOREIGN
        if status == book.FREED:
            if self._closed:
                self._release_if_empty()
            return
        if status == book.FOREIGN:
            with self._lock:
                given = self._fallen.get(address)
                if given is not None and given == nbytes:
                    del self._fallen[address]
                    self._fallbacks[0] -= 1
            if given is not None and given == nbytes:
                assert self._fallback is not None
                self._fallback.deallocate(address, nbytes, stream)
                if self._closed:
                    self._release_if_empty()
                return
            if given is not None:
                raise SizeMismatchError(
                    f"deallocate({address:#x}, {nbytes}): the block was allocated with "
                    f"{given} bytes", address=address, given=nbytes, allocated=given)
            raise InvalidAddressError(f"deallocate({address:#x}): not a block of {self!r}",
                                      address=address)
        if status == book.SIZE_MISMATCH:
            allocated = self._size_of(address)
            raise SizeMismatchError(
                f"deallocate({address:#x}, {nbytes}): the block was allocated with "
                f"{allocated} bytes", address=address, given=nbytes, allocated=allocated or 0)
        if status == book.NOT_LIVE:
            raise DoubleFreeError(f"deallocate({address:#x}): not live in {self!r} (freed "
                                  f"already, or never allocated)", address=address)
        if status == book.ROUTED:
            raise InvalidAddressError(
                f"deallocate({address:#x}): a tensor's block, taken by a torch route with no "
                f"Python call: torch frees it when the tensor dies", address=address)
        raise InvalidAddressError(f"deallocate({address:#x}): inside a live block of {self!r}, "
                                  f"not its start", address=address)

    # --- what it holds -------------------------------------------------------------------------

    def _stats(self) -> tuple[int, ...]:
        if self._capsule is not None:
            return self._shim.native_pool_statistics(self._capsule)  # type: ignore[no-any-return]
        return self._book.statistics()  # type: ignore[no-any-return]

    def _blocks(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        if self._capsule is not None:
            return self._shim.native_pool_blocks(self._capsule)  # type: ignore[no-any-return]
        return self._book.blocks()  # type: ignore[no-any-return]

    def statistics(self) -> MemoryStatistics:
        """The arena's counters (a frozen snapshot; the fallback's blocks: :attr:`fallbacks`)."""
        (blocks, blocks_peak, blocks_total, requested, requested_peak, requested_total,
         reserved, reserved_peak, reserved_total, free, largest, extents, ooms, _) = self._stats()
        held = 0 if not self._released.alive else self._capacity
        allocated = Count(reserved, reserved_peak, reserved_total)
        return MemoryStatistics(
            requested_bytes=Count(requested, requested_peak, requested_total),
            allocated_bytes=allocated, active_bytes=allocated,
            reserved_bytes=Count(held, self._capacity, self._capacity),
            allocations=Count(blocks, blocks_peak, blocks_total),
            segments=Count(1 if held else 0, 1, 1),
            inactive_split_bytes=free if blocks else 0, free_bytes=free,
            largest_free_bytes=largest, free_extents=extents, num_ooms=ooms,
            num_upstream_allocs=1, num_upstream_frees=0 if held else 1, limit=self._capacity)

    def live_blocks(self) -> dict[int, int]:
        """Every live block's address and requested size, the arena's and the fallback's."""
        live = dict(self._blocks()[0])
        with self._lock:
            live.update(self._fallen)
        return live

    def free_extents(self) -> list[tuple[int, int]]:
        """The arena's free extents ``(address, nbytes)``, by address."""
        return self._blocks()[1]

    def owns(self, address: int) -> bool:
        """Whether ``address`` lies in the arena."""
        return self._base <= address < self._base + self._capacity

    def reset_peak_stats(self) -> None:
        """Set the peaks to their current values."""
        if self._capsule is not None:
            self._shim.native_pool_reset_peaks(self._capsule)
        else:
            self._book.reset_peaks()
        with self._lock:
            self._fallbacks[1] = self._fallbacks[0]

    # --- routes and closing --------------------------------------------------------------------

    def attach_route(self, shim: Any, route: Any) -> bool:
        """Let the route of a route capsule take blocks here with no Python call (what
        :func:`tensorarena.torch.use` does); False where the books are kept in Python."""
        if self._capsule is None or shim is not self._shim:
            return False
        shim.native_pool_attach(route, self._capsule)
        return True

    def close(self) -> None:
        """Take no new requests; the arena goes back to the upstream once no block is live (now,
        if none is). Closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._capsule is not None:
            self._shim.native_pool_close(self._capsule)
        else:
            self._book.close()
        self._release_if_empty()

    def _release_if_empty(self) -> None:
        if not self._stats()[0] and not self._fallen:
            self._released()  # once: a finalizer runs at most once

    def __enter__(self) -> NativePool:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        stats = self._stats()
        books = "native" if self._capsule is not None else "python"
        return (f"NativePool({format_size(self._capacity)}, {self._strategy}, {books}, "
                f"live={stats[0]}, allocated={format_size(stats[6])}"
                f"{', closed' if self._closed else ''})")
