"""``ManagedMemory``: unified memory (``cudaMallocManaged``), with advice and prefetch.

One address space for host and device: pages migrate on demand to whichever processor touches
them, which allows oversubscribing the GPU at the cost of migration faults (and thrashing when
both sides keep touching the same pages). The source document's remedies are the driver's
hints, exposed here as :meth:`ManagedMemory.advise` (``cudaMemAdvise``: read mostly, preferred
location, accessed by) and :meth:`ManagedMemory.prefetch` (``cudaMemPrefetchAsync``: migrate a
range ahead of its use, ordered on a stream). Explicit device pools and asynchronous copies stay
the default for speed; ``bench/gpu_managed.py`` measures the difference prefetching makes.

A request larger than the device's free memory is refused with
:class:`~tensorarena.errors.OutOfMemoryError` *before* the driver is asked: asking a GPU for more
managed memory than it has free can hang it, not just the process (observed on shared machines).
Advice and prefetch check that the range lies inside a live block of this resource before any
call, so a typo'd address is an :class:`~tensorarena.errors.InvalidAddressError`, not a driver
error or a silent no-op. The CPU may read and write managed memory (``memory_kind`` MANAGED), so
``tensorarena.empty`` builds NumPy arrays over it. It is the CUDA device resource with another
driver call (a :class:`~tensorarena.memory.cuda.CudaMemory` variant) plus the two hints.
"""

from __future__ import annotations

from typing import Any, Literal

from tensorarena.errors import InvalidAddressError, InvalidArgumentError
from tensorarena.memory.cuda.device import CudaMemory, check_device
from tensorarena.memory.cuda.runtime import CPU_DEVICE, stream_handle
from tensorarena.memory.resource import MemoryKind, Stream
from tensorarena.sizes import check_address, check_nbytes

__all__ = ["ADVICE", "Advice", "ManagedMemory"]

Advice = Literal[
    "read_mostly",
    "unset_read_mostly",
    "preferred_location",
    "unset_preferred_location",
    "accessed_by",
    "unset_accessed_by",
]

#: Our names for ``cudaMemoryAdvise`` values.
ADVICE: dict[str, int] = {
    "read_mostly": 1,
    "unset_read_mostly": 2,
    "preferred_location": 3,
    "unset_preferred_location": 4,
    "accessed_by": 5,
    "unset_accessed_by": 6,
}

#: Managed allocations are page-granular; cudaMallocManaged returns page-aligned addresses.
_MANAGED_ALIGNMENT = 4096


class ManagedMemory(CudaMemory):
    """Unified memory from ``cudaMallocManaged``, associated with GPU ``device``."""

    #: Managed memory: host and device both reach it.
    memory_kind = MemoryKind.MANAGED
    _granule = _MANAGED_ALIGNMENT
    _call = "cudaMallocManaged"

    # --- hints ---------------------------------------------------------------------------

    def advise(
        self,
        address: int,
        nbytes: int,
        advice: Advice,
        device: int | Literal["cpu"] | None = None,
    ) -> None:
        """``cudaMemAdvise`` over ``[address, address + nbytes)``, which must lie in a live
        block. ``device``: the processor the advice names (default this resource's; ``"cpu"``
        the host)."""
        value = ADVICE.get(advice) if isinstance(advice, str) else None
        if value is None:
            raise InvalidArgumentError(
                f"unknown advice {advice!r}: expected one of {', '.join(ADVICE)}"
            )
        address, nbytes = self._check_range(address, nbytes)
        self._runtime.mem_advise(address, nbytes, value, self._target(device))

    def prefetch(
        self,
        address: int,
        nbytes: int,
        device: int | Literal["cpu"] | None = None,
        stream: Stream = None,
    ) -> None:
        """``cudaMemPrefetchAsync``: migrate ``[address, address + nbytes)`` (inside a live
        block) to ``device`` (default this resource's; ``"cpu"`` the host), ordered on
        ``stream`` (``None``: the legacy default stream)."""
        address, nbytes = self._check_range(address, nbytes)
        target = self._target(device)
        self._runtime.mem_prefetch(address, nbytes, target, stream_handle(stream))

    # --- internals -------------------------------------------------------------------------

    def _obtain(self, size: int) -> int:
        """``cudaMallocManaged``, refused first when over the device's free memory."""
        free, _ = self._runtime.mem_get_info()
        if size > free:
            raise self._out_of_memory(
                size,
                "the device's free memory (managed memory is never asked of the driver beyond "
                "it)",
                None,
            )
        return self._runtime.malloc_managed(size)

    def _target(self, device: Any) -> int:
        if device is None:
            return self._device
        if device == "cpu":
            return CPU_DEVICE
        return check_device(device, self._count)

    def _check_range(self, address: object, nbytes: object) -> tuple[int, int]:
        address = check_address(address)
        nbytes = check_nbytes(nbytes)
        with self._lock:
            for start, (size, _, _) in self._blocks.items():
                if start <= address and address + nbytes <= start + size:
                    return address, nbytes
        raise InvalidAddressError(
            f"ManagedMemory: [{address:#x}, +{nbytes}) is not inside a live block of this "
            "resource",
            address=address,
        )
