"""Device arrays: bytes from a device resource, shared with CuPy, Numba and PyTorch by pointer.

:class:`DeviceArray` owns one block of device (or managed) memory from a resource and describes
it through ``__cuda_array_interface__`` (version 3), the protocol every CUDA library in Python
reads: ``torch.as_tensor(a, device="cuda")``, ``cupy.asarray(a)`` and
``numba.cuda.as_cuda_array(a)`` wrap the same bytes without copying, and each keeps a reference
to the array, so the block goes back to its resource only when the array and every consumer's
view of it are gone (the same ownership rule as :func:`tensorarena.empty` on the host).

The interface's ``stream`` entry carries the stream the bytes were last written on (a transfer's
copy stream, say): a consumer synchronises with it before reading, as version 3 of the protocol
asks: 1 for the legacy default stream (``None`` or handle 0 here), 2 for the per-thread default
stream, the handle otherwise, and ``None`` only when no synchronisation is needed (a fresh array
nothing has written, or bytes written by a CPU stream). DLPack is left to the consumers: each of
those libraries converts to it from here.

The default resource is the current device's stream-ordered pool
(:func:`~tensorarena.interop.stream_pools.stream_ordered_pool`), so an array dropped while its
stream's kernels still use it is not handed to another stream before they finish; the free runs
with the array's device current.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tensorarena._optional import require
from tensorarena.errors import (
    DeviceUnavailableError,
    InvalidArgumentError,
    InvalidDtypeError,
    InvalidResourceError,
    InvalidSizeError,
)
from tensorarena.memory.cuda.current import block_device
from tensorarena.memory.resource import (
    DEFAULT_ALIGNMENT,
    MemoryKind,
    MemoryResource,
    Stream,
    resource_stack,
)
from tensorarena.memory_kind import memory_kind_of
from tensorarena.sizes import format_size

__all__ = ["DeviceArray", "check_device_accessible", "device_empty", "device_of"]

#: CUDA array interface stream values (version 3): 1 is the legacy default stream, 2 the
#: per-thread one (the runtime's handles for them are 0 or 1, and 2).
_LEGACY_DEFAULT = 1


def check_device_accessible(resource: object) -> MemoryResource:
    """Return ``resource`` if a GPU can use its memory (device or managed), else raise
    :class:`~tensorarena.errors.InvalidResourceError`."""
    kind = memory_kind_of(resource)
    if kind not in (MemoryKind.DEVICE, MemoryKind.MANAGED):
        shown = "declares no memory_kind" if kind is None else f"holds {kind.value} memory"
        raise InvalidResourceError(
            f"device arrays need device or managed memory: {type(resource).__name__} {shown} "
            "(use device_pool() or a Pool over CudaMemory/ManagedMemory)"
        )
    return resource  # type: ignore[return-value]


def device_of(resource: object) -> int | None:
    """The device a resource allocates on: its own ``device``, else its upstream's (through
    pools and adaptors); ``None`` when nothing in the chain says."""
    for layer in resource_stack(resource):
        device = getattr(layer, "device", None)
        if isinstance(device, int) and not isinstance(device, bool):
            return device
    return None


def _interface_stream(stream: Stream) -> int | None:
    """What ``stream`` (the stream that wrote the bytes) is in the interface's ``stream``."""
    if stream is None:
        return _LEGACY_DEFAULT  # None is the legacy default stream, as in stream_handle()
    for attribute in ("handle", "cuda_stream", "ptr"):
        value = getattr(stream, attribute, None)
        if value is not None:
            stream = value
            break
    try:
        handle = int(stream)
    except (TypeError, ValueError):
        return None  # a CPU stream: nothing a CUDA consumer could synchronise with
    return handle or _LEGACY_DEFAULT


def _checked_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or any(
        isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape
    ):
        raise InvalidSizeError(f"shape {shape!r}: dimensions must be non-negative ints")
    return tuple(int(d) for d in shape)


def _checked_dtype(dtype: object) -> np.dtype[Any]:
    try:
        resolved: np.dtype[Any] = np.dtype(dtype)  # type: ignore[call-overload]
    except (TypeError, ValueError) as exc:
        raise InvalidDtypeError(f"not a dtype: {dtype!r} ({exc})") from None
    if resolved.hasobject or resolved.itemsize == 0:
        raise InvalidDtypeError(f"device memory cannot hold dtype {resolved}")
    return resolved


class DeviceArray:
    """``shape`` × ``dtype`` bytes at ``address`` from ``resource``; freed when this dies.

    The array takes the block only once its constructor returns: bad arguments raise (an
    :class:`~tensorarena.errors.InvalidSizeError`, ``InvalidDtypeError``, ``InvalidResourceError``
    or ``InvalidArgumentError``) and leave the block the caller's to free."""

    __slots__ = (
        "__weakref__",
        "_interface",
        "_owns_block",
        "address",
        "device",
        "dtype",
        "nbytes",
        "resource",
        "shape",
        "stream",
    )

    def __init__(
        self,
        resource: MemoryResource,
        address: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        *,
        stream: Stream = None,
        device: int | None = None,
    ) -> None:
        # Everything is checked before the array takes the block: a constructor that raised
        # owns nothing, its half-built object frees nothing, and the block stays the caller's.
        self._owns_block = False
        dims = _checked_shape(shape)
        resolved = _checked_dtype(dtype)
        check_device_accessible(resource)
        if isinstance(address, bool) or not isinstance(address, (int, np.integer)) or address < 0:
            raise InvalidArgumentError(f"address {address!r}: must be a non-negative int")
        self.resource = resource
        self.address = int(address)
        self.shape = dims
        self.dtype = resolved
        self.nbytes = max(math.prod(dims) * resolved.itemsize, 1)
        self.stream = stream
        self.device = device
        self._interface: dict[str, Any] = {
            "shape": dims,
            "typestr": resolved.str,
            "data": (self.address, False),
            "strides": None,
            "version": 3,
            "stream": None if stream is None else _interface_stream(stream),  # nothing written
        }
        self._owns_block = True

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) describing the bytes."""
        return self._interface

    def written_on(self, stream: Stream) -> None:
        """Record that work on ``stream`` writes the bytes (consumers synchronise with it)."""
        self.stream = stream
        self._interface["stream"] = _interface_stream(stream)

    def to_torch(self) -> Any:
        """A ``torch.Tensor`` over the same bytes (no copy); it keeps this array alive.

        Raises :class:`~tensorarena.errors.DeviceUnavailableError` when torch cannot reach the
        device (a CPU-only build, no driver, no such device index)."""
        torch = require("torch", extra="torch", feature="DeviceArray.to_torch()")
        # Asked before torch sees the array: torch.as_tensor raising for a missing CUDA keeps
        # a reference to its argument (torch 2.13), so the block would never go back.
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"DeviceArray.to_torch(): torch {torch.__version__} cannot use CUDA "
                "(a CPU-only build, or no driver or GPU on this machine)"
            )
        if self.device is not None and not 0 <= self.device < torch.cuda.device_count():
            raise DeviceUnavailableError(
                f"DeviceArray.to_torch(): the array is on device {self.device} but torch sees "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
        device = "cuda" if self.device is None else f"cuda:{self.device}"
        return torch.as_tensor(self, device=device)

    def to_cupy(self) -> Any:
        """A ``cupy.ndarray`` over the same bytes (no copy); it keeps this array alive."""
        cupy = require("cupy", extra="cupy", feature="DeviceArray.to_cupy()")
        return cupy.asarray(self)

    def __del__(self) -> None:
        # The last reference is gone (ours and every consumer's): the bytes go back, ordered
        # on the stream that last wrote them. A half-built array (its constructor raised, or
        # it was made by __new__ alone) never took a block and gives none back.
        if getattr(self, "_owns_block", False):
            with block_device(self.device):
                try:
                    self.resource.deallocate(self.address, self.nbytes, self.stream)
                except InvalidArgumentError:
                    # A stream the resource cannot order on (a CPU stream given to a CUDA
                    # stream-ordered pool): order on its default stream rather than lose it.
                    self.resource.deallocate(self.address, self.nbytes, None)

    def __repr__(self) -> str:
        where = "" if self.device is None else f", device={self.device}"
        return (
            f"DeviceArray(shape={self.shape}, dtype={self.dtype}, "
            f"{format_size(self.nbytes)} at {self.address:#x}{where})"
        )


def device_empty(
    shape: int | tuple[int, ...] | list[int],
    dtype: Any = np.float32,
    *,
    resource: MemoryResource | None = None,
    stream: Stream = None,
    alignment: int = DEFAULT_ALIGNMENT,
) -> DeviceArray:
    """A C-contiguous :class:`DeviceArray` of fresh, uninitialised bytes from ``resource``
    (default: the current device's stream-ordered pool, ``stream_ordered_pool()``), allocated
    for ``stream``."""
    dims = _checked_shape(shape)
    resolved = _checked_dtype(dtype)
    if resource is None:
        from tensorarena.interop.stream_pools import stream_ordered_pool

        resource = stream_ordered_pool()
    check_device_accessible(resource)
    nbytes = max(math.prod(dims) * resolved.itemsize, 1)
    address = resource.allocate(nbytes, alignment, stream)
    return DeviceArray(
        resource, address, dims, resolved, stream=stream, device=device_of(resource)
    )
