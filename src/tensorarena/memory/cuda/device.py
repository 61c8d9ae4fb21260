"""``CudaMemory``: device memory of one GPU, one ``cudaMalloc`` per allocation.

The GPU counterpart of :class:`~tensorarena.memory.HostMemory`, and like it an *upstream*: a
``cudaMalloc`` costs tens of microseconds and may synchronise the device, so tensors should come
from a :class:`~tensorarena.memory.Pool` over it (``device_pool()`` makes one per device). Each
block is allocated on the resource's own device whatever device is current (the current one is
restored after), and freed there, so a pool made for GPU 1 never takes memory from GPU 0.

``cudaMalloc`` returns addresses aligned to 256 bytes or more; a larger alignment is honoured by
asking for ``alignment - 256`` more bytes and handing out the aligned address inside (the block
remembers the address to free). Running out of device memory is an
:class:`~tensorarena.errors.OutOfMemoryError` carrying the device's free and total bytes; every
other failing call is a :class:`~tensorarena.errors.CudaError`, and in both cases the ledger is
unchanged.
"""

from __future__ import annotations

import threading

from tensorarena.errors import CudaError, InvalidArgumentError, OutOfMemoryError
from tensorarena.memory.cuda.runtime import OUT_OF_MEMORY, CudaRuntime, cuda_runtime
from tensorarena.memory.live_blocks import LiveBlocks
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryKind, Stream
from tensorarena.sizes import align_up, check_request, format_size
from tensorarena.stats import MemoryStatistics

__all__ = ["CUDA_MALLOC_ALIGNMENT", "CudaMemory", "check_device"]

#: What ``cudaMalloc`` guarantees (the CUDA programming guide: "at least 256 bytes").
CUDA_MALLOC_ALIGNMENT = 256


def check_device(device: object, count: int) -> int:
    """``device`` as an int in ``[0, count)``, else InvalidArgumentError naming the devices."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise InvalidArgumentError(f"device must be an int, not {type(device).__name__}")
    if not 0 <= device < count:
        seen = f"this machine has {count} (0..{count - 1})" if count else "none is visible"
        raise InvalidArgumentError(f"no CUDA device {device}: {seen}")
    return int(device)


def out_of_memory(runtime: CudaRuntime, nbytes: int, what: str, exc: CudaError | None,
                  *, allocated: int) -> OutOfMemoryError:
    """The OutOfMemoryError for a refused device request, with the device's free and total."""
    try:
        free, total = runtime.mem_get_info()
    except CudaError:
        free = total = 0
    cause = f" ({exc.name})" if exc is not None else ""
    return OutOfMemoryError(
        nbytes,
        free=free,
        largest_free=free,
        capacity=total,
        allocated=allocated,
        detail=f"{what} refused {format_size(nbytes)}{cause}",
    )


class CudaMemory:
    """Device memory of GPU ``device`` (default: the current one), from ``cudaMalloc``."""

    #: Device memory: the CPU must not dereference it.
    memory_kind = MemoryKind.DEVICE
    #: What the driver's allocation call aligns to; larger alignments are over-allocated.
    _granule = CUDA_MALLOC_ALIGNMENT
    _call = "cudaMalloc"

    def __init__(self, device: int | None = None, *, runtime: CudaRuntime | None = None) -> None:
        self._runtime = cuda_runtime() if runtime is None else runtime
        self._count = self._runtime.device_count()
        self._device = self._runtime.get_device() if device is None else check_device(
            device, self._count
        )
        self._blocks = LiveBlocks(type(self).__name__)
        self._lock = threading.Lock()

    # --- the resource protocol -------------------------------------------------------------

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Allocate at least ``nbytes`` on this device, aligned to ``alignment``.

        ``stream`` is accepted and ignored: ``cudaMalloc`` is not stream-ordered (wrap a pool
        over this in :class:`~tensorarena.adaptors.StreamOrdered` for stream semantics).
        """
        nbytes, alignment = check_request(nbytes, alignment)
        size = nbytes + (alignment - self._granule if alignment > self._granule else 0)
        try:
            with self._runtime.on_device(self._device):
                base = self._obtain(size)
        except CudaError as exc:
            if exc.status != OUT_OF_MEMORY:
                raise
            raise self._out_of_memory(size, f"{self._call} on device {self._device}", exc) from exc
        address = align_up(base, alignment)
        with self._lock:
            self._blocks.add(address, nbytes, size, base)
        return address

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """``cudaFree`` the block at ``address``, which was allocated with ``nbytes``."""
        with self._lock:
            address, (_, _, base) = self._blocks.lookup(address, nbytes)
            with self._runtime.on_device(self._device):
                self._runtime.free(base)  # type: ignore[arg-type]
            self._blocks.remove(address)

    # --- queries ---------------------------------------------------------------------------

    @property
    def device(self) -> int:
        """The GPU this resource allocates on."""
        return self._device

    @property
    def runtime(self) -> CudaRuntime:
        """The runtime it calls."""
        return self._runtime

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of this device now."""
        with self._runtime.on_device(self._device):
            return self._runtime.mem_get_info()

    def live_blocks(self) -> dict[int, int]:
        """A copy of the live blocks: address → requested bytes."""
        with self._lock:
            return self._blocks.live_blocks()

    def statistics(self) -> MemoryStatistics:
        """A frozen snapshot: ``allocated_bytes`` (= ``reserved_bytes``) counts the bytes the
        driver gave (alignment slack included)."""
        with self._lock:
            return self._blocks.statistics()

    def reset_peak_stats(self) -> None:
        """Set every peak to its current value."""
        with self._lock:
            self._blocks.reset_peaks()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(device={self._device}, live={len(self._blocks)}, "
            f"allocated={format_size(self._blocks.held)})"
        )

    # --- what a variant changes --------------------------------------------------------------

    def _obtain(self, size: int) -> int:
        """The driver call, on this device: ``cudaMalloc``."""
        return self._runtime.malloc(size)

    def _out_of_memory(self, size: int, what: str, exc: CudaError | None) -> OutOfMemoryError:
        with self._lock:
            self._blocks.count_oom()
            held = self._blocks.held
        return out_of_memory(self._runtime, size, what, exc, allocated=held)
