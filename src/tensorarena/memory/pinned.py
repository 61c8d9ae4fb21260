"""Page-locked ("pinned") host memory: the buffers a GPU can copy to and from by DMA.

Pageable memory makes the driver stage every host↔device copy through a pinned bounce buffer;
memory that is locked in RAM can be copied directly and asynchronously. Pinned memory is scarce
(the kernel caps it per process with ``RLIMIT_MEMLOCK``) so it deserves its own resource and,
above it, its own pool.

How pages get pinned is a *pinning backend*, chosen at construction:

- :class:`MlockBackend` (always available on Linux): ``mmap`` + ``mlock``, the mechanism
  ``cudaHostRegister`` uses. The soft ``RLIMIT_MEMLOCK`` is checked *before* ``mlock``, against
  the bytes the whole process has locked now (``VmLck``), and a request over it raises
  :class:`OutOfMemoryError` with ``limit`` set, naming the limit and how to raise it.
- a CUDA backend (``cudaHostAlloc``) arrives with the GPU layer; it implements the same small
  :class:`PinningBackend` protocol and ``backend="auto"`` will prefer it where CUDA exists.
"""

from __future__ import annotations

import dataclasses
import resource as _rlimit
import threading
from typing import Literal, Protocol

from tensorarena.errors import OutOfMemoryError, UnknownBackendError
from tensorarena.memory import _libc
from tensorarena.memory._live import LiveBlocks
from tensorarena.memory.host import PAGE_SIZE, map_region, unmap_region
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryKind, Stream
from tensorarena.sizes import Size, align_up, check_request, format_size, parse_size
from tensorarena.stats import MemoryStatistics

__all__ = [
    "MlockBackend",
    "PinnedHostMemory",
    "PinningBackend",
    "UnknownBackendError",
    "locked_bytes",
    "memlock_limit",
]


def memlock_limit() -> int | None:
    """The soft ``RLIMIT_MEMLOCK`` in bytes, or ``None`` when it is unlimited."""
    soft, _ = _rlimit.getrlimit(_rlimit.RLIMIT_MEMLOCK)
    return None if soft == _rlimit.RLIM_INFINITY else int(soft)


def locked_bytes() -> int | None:
    """Bytes this process has locked in RAM now (``VmLck`` of ``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmLck:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class PinningBackend(Protocol):
    """How a :class:`PinnedHostMemory` gets and releases page-locked bytes."""

    name: str

    def pin(self, length: int, alignment: int) -> int:
        """Return the address of ``length`` (a page multiple) fresh page-locked bytes."""
        ...

    def unpin(self, address: int, length: int) -> None:
        """Release bytes returned by :meth:`pin`."""
        ...

    def limit(self) -> int | None:
        """Bytes the process may have pinned in total, or ``None`` when unbounded."""
        ...

    def pinned(self) -> int | None:
        """Bytes the process has pinned now (all owners), or ``None`` if unknown."""
        ...


class MlockBackend:
    """Pin with ``mmap`` + ``mlock`` (as ``cudaHostRegister`` does), capped by RLIMIT_MEMLOCK."""

    name = "mlock"

    def pin(self, length: int, alignment: int) -> int:
        """Map ``length`` bytes and lock them (``mlock`` faults every page in)."""
        address = map_region(length, alignment)
        try:
            _libc.mlock(address, length)
        except OSError:
            unmap_region(address, length)
            raise
        return address

    def unpin(self, address: int, length: int) -> None:
        """Unlock and unmap (``munmap`` alone would unlock too; being explicit costs nothing)."""
        _libc.munlock(address, length)
        unmap_region(address, length)

    def limit(self) -> int | None:
        """The soft ``RLIMIT_MEMLOCK``."""
        return memlock_limit()

    def pinned(self) -> int | None:
        """``VmLck``: every byte the process has locked, by us or anyone else."""
        return locked_bytes()


def _backend(spec: Literal["auto", "mlock"] | PinningBackend) -> PinningBackend:
    if spec in ("auto", "mlock"):
        return MlockBackend()
    if isinstance(spec, str):
        raise UnknownBackendError(
            f"unknown pinning backend {spec!r}: expected 'auto', 'mlock' or a PinningBackend"
        )
    return spec


class PinnedHostMemory:
    """Page-locked host memory, one locked region per allocation; refuses requests over the limit.

    ``limit`` caps the bytes *this process* has locked (default: the soft ``RLIMIT_MEMLOCK`` of
    the backend). It is checked before pinning; a privileged process (``CAP_IPC_LOCK``) that
    wants more than its rlimit passes a larger ``limit`` explicitly.
    """

    #: Host memory (page-locked): the CPU reads and writes it.
    memory_kind = MemoryKind.HOST

    def __init__(
        self,
        backend: Literal["auto", "mlock"] | PinningBackend = "auto",
        *,
        limit: Size | None = None,
    ) -> None:
        if not _libc.available():
            raise OSError("PinnedHostMemory needs Linux")
        self._backend = _backend(backend)
        self._limit = None if limit is None else parse_size(limit, name="limit")
        self._blocks = LiveBlocks("PinnedHostMemory")
        self._lock = threading.Lock()

    # --- the resource protocol -------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Pin a fresh region of at least ``nbytes`` bytes aligned to ``alignment``."""
        nbytes, alignment = check_request(nbytes, alignment)
        length = align_up(nbytes, PAGE_SIZE)
        with self._lock:
            limit = self.limit
            if limit is not None:
                pinned_now = self._backend.pinned()
                if pinned_now is None:
                    pinned_now = self._blocks.held
                if pinned_now + length > limit:
                    room = max(limit - pinned_now, 0)
                    self._blocks.count_oom()
                    raise OutOfMemoryError(
                        length,
                        free=room,
                        largest_free=room,
                        capacity=limit,
                        limit=limit,
                        allocated=pinned_now,
                        detail=(
                            f"pinned memory is capped at {format_size(limit)} "
                            f"(RLIMIT_MEMLOCK soft limit {self._rlimit_text()}); the process "
                            f"has {format_size(pinned_now)} locked. Raise it with `ulimit -l` "
                            "or pass a larger limit= to a process with CAP_IPC_LOCK"
                        ),
                    )
            try:
                address = self._backend.pin(length, alignment)
            except OSError as exc:
                self._blocks.count_oom()
                raise OutOfMemoryError(
                    length,
                    free=0,
                    largest_free=0,
                    capacity=limit or 0,
                    limit=limit,
                    detail=f"the {self._backend.name} backend could not pin: {exc}",
                ) from exc
            self._blocks.add(address, nbytes, length)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Unpin and release the region at ``address``, which was allocated with ``nbytes``."""
        with self._lock:
            address, (_, length, _) = self._blocks.lookup(address, nbytes)
            self._backend.unpin(address, length)
            self._blocks.remove(address)

    # --- queries ---------------------------------------------------------------------------

    @property
    def backend(self) -> PinningBackend:
        """The pinning backend in use."""
        return self._backend

    @property
    def limit(self) -> int | None:
        """The cap on locked bytes in the process: ``limit=`` if given, else the backend's."""
        return self._limit if self._limit is not None else self._backend.limit()

    @property
    def pinned(self) -> int:
        """Bytes pinned by this resource (whole pages)."""
        return self._blocks.held

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return self._blocks.live_blocks()

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot: ``allocated_bytes`` (= ``reserved_bytes``) counts pinned bytes."""
        with self._lock:
            stats = self._blocks.statistics()
        limit = self.limit
        return dataclasses.replace(stats, limit=limit)

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._blocks.reset_peaks()

    def __repr__(self) -> str:
        limit = self.limit
        return (
            f"PinnedHostMemory(backend={self._backend.name}, live={len(self._blocks)}, "
            f"pinned={format_size(self._blocks.held)}, "
            f"limit={'unlimited' if limit is None else format_size(limit)})"
        )

    @staticmethod
    def _rlimit_text() -> str:
        rlimit = memlock_limit()
        return "unlimited" if rlimit is None else format_size(rlimit)
