"""Page-locked ("pinned") host memory: the buffers a GPU can copy to and from by DMA.

Pageable memory makes the driver stage every host↔device copy through a pinned bounce buffer;
memory that the *driver* has pinned can be copied directly and asynchronously. Pinned memory is
scarce (the kernel caps locked memory per process with ``RLIMIT_MEMLOCK``) so it deserves its
own resource and, above it, its own pool (``tensorarena.memory.devices.pinned_pool()``).

How pages get pinned is a *pinning backend*, chosen at construction:

- ``backend="auto"`` (the default): the CUDA driver's ``cudaHostAlloc``
  (:class:`~tensorarena.memory.cuda.CudaHostAllocBackend`) where CUDA and a GPU are present, else
  the ``mlock`` backend;
- ``backend="cuda"``: the driver's, or :class:`~tensorarena.errors.MissingDependencyError`;
- ``backend="mlock"`` (:class:`MlockBackend`, always available on Linux): ``mmap`` + ``mlock``.
  The pages are **page-locked but not DMA-registered**: resident, never swapped, but unknown to
  any GPU driver, so a copy from them runs at pageable speed, a fraction of driver-pinned
  memory's (``bench/RESULTS.md``). The soft
  ``RLIMIT_MEMLOCK`` is checked *before* ``mlock``, against the bytes the whole process has
  locked now (``VmLck``), and a request over it raises :class:`OutOfMemoryError` with ``limit``
  set, naming the limit and how to raise it. :class:`LockedHostMemory` is this variant under a
  name that says what it is.

A backend says which it is (``dma_registered``), and so do ``PinnedHostMemory.dma_registered``
and its ``repr``: nothing calls mlock'd pages "pinned for the GPU" by accident.
"""

from __future__ import annotations

import dataclasses
import resource as _rlimit
import threading
from typing import Literal, Protocol

from tensorarena.errors import OutOfMemoryError, UnknownNameError
from tensorarena.memory import libc
from tensorarena.memory.host import PAGE_SIZE, map_region, unmap_region
from tensorarena.memory.live_blocks import LiveBlocks
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryKind, Stream
from tensorarena.sizes import Size, align_up, check_request, format_size, parse_size
from tensorarena.stats import MemoryStatistics

__all__ = [
    "LockedHostMemory",
    "MlockBackend",
    "PinnedHostMemory",
    "PinningBackend",
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
    """How a :class:`PinnedHostMemory` gets and releases page-locked bytes.

    A backend may also declare ``dma_registered`` (default False): True when a GPU driver pinned
    the pages itself, so copies from them run by direct DMA.
    """

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
    """Lock pages with ``mmap`` + ``mlock``, capped by RLIMIT_MEMLOCK: page-locked, **not**
    DMA-registered (no GPU driver knows these pages; copies stage through its bounce buffer)."""

    name = "mlock"
    #: No driver pinned these pages: copies run at pageable speed.
    dma_registered = False

    def pin(self, length: int, alignment: int) -> int:
        """Map ``length`` bytes and lock them (``mlock`` faults every page in)."""
        address = map_region(length, alignment)
        try:
            libc.mlock(address, length)
        except OSError:
            unmap_region(address, length)
            raise
        return address

    def unpin(self, address: int, length: int) -> None:
        """Unlock and unmap (``munmap`` alone would unlock too; being explicit costs nothing)."""
        libc.munlock(address, length)
        unmap_region(address, length)

    def limit(self) -> int | None:
        """The soft ``RLIMIT_MEMLOCK``."""
        return memlock_limit()

    def pinned(self) -> int | None:
        """``VmLck``: every byte the process has locked, by us or anyone else."""
        return locked_bytes()


BackendSpec = Literal["auto", "cuda", "mlock"]


def _cuda_backend(*, required: bool) -> PinningBackend | None:
    """The driver's pinning backend if CUDA and a GPU are present (imported only if asked)."""
    from tensorarena.memory.cuda import CudaHostAllocBackend, cuda_available, cuda_runtime

    if required:
        runtime = cuda_runtime()  # MissingDependencyError names the extra
        if not runtime.available():
            raise UnknownNameError(
                "pinning backend 'cuda' needs a CUDA device, and the runtime sees none",
                kind="pinning backend", name="cuda", known=("auto", "mlock"),
            )
        return CudaHostAllocBackend(runtime=runtime)
    return CudaHostAllocBackend() if cuda_available() else None


def _backend(spec: BackendSpec | PinningBackend) -> PinningBackend:
    if spec == "mlock":
        return MlockBackend()
    if spec == "auto":
        return _cuda_backend(required=False) or MlockBackend()
    if spec == "cuda":
        backend = _cuda_backend(required=True)
        assert backend is not None
        return backend
    if isinstance(spec, str):
        raise UnknownNameError(
            f"unknown pinning backend {spec!r}: expected 'auto', 'cuda', 'mlock' or a "
            "PinningBackend", kind="pinning backend", name=spec, known=("auto", "cuda", "mlock"),
        )
    return spec


class PinnedHostMemory:
    """Page-locked host memory, one locked region per allocation; refuses requests over the limit.

    DMA-registered (driver-pinned) where CUDA is present, merely ``mlock``'d otherwise: see
    :attr:`dma_registered` and the module docstring. ``limit`` caps the bytes *this process* has
    locked (default: the backend's, the soft ``RLIMIT_MEMLOCK`` for ``mlock``). It is checked
    before pinning; a privileged process (``CAP_IPC_LOCK``) that wants more than its rlimit
    passes a larger ``limit`` explicitly.
    """

    #: Host memory (page-locked): the CPU reads and writes it.
    memory_kind = MemoryKind.HOST

    def __init__(
        self,
        backend: BackendSpec | PinningBackend = "auto",
        *,
        limit: Size | None = None,
    ) -> None:
        if not libc.available():
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
    def dma_registered(self) -> bool:
        """True when a GPU driver pinned the pages (copies by direct DMA); False for pages that
        are only page-locked (``mlock``), which copy at pageable speed."""
        return bool(getattr(self._backend, "dma_registered", False))

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
        what = "DMA-registered" if self.dma_registered else "page-locked only, not DMA-registered"
        return (
            f"{type(self).__name__}(backend={self._backend.name} ({what}), "
            f"live={len(self._blocks)}, "
            f"pinned={format_size(self._blocks.held)}, "
            f"limit={'unlimited' if limit is None else format_size(limit)})"
        )

    @staticmethod
    def _rlimit_text() -> str:
        rlimit = memlock_limit()
        return "unlimited" if rlimit is None else format_size(rlimit)


class LockedHostMemory(PinnedHostMemory):
    """Host memory locked in RAM by ``mlock``: page-locked, **not** DMA-registered.

    The pages stay resident (never swapped, never faulted after the first touch), which is what
    latency-sensitive host buffers want; but no GPU driver knows they are locked, so a copy to a
    GPU from them stages through the driver's bounce buffer at pageable speed. For transfer
    buffers use :class:`PinnedHostMemory` (driver-pinned where CUDA is present).
    """

    def __init__(self, *, limit: Size | None = None) -> None:
        super().__init__(MlockBackend(), limit=limit)
