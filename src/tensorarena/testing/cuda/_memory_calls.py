"""The simulator's memory calls: allocation, registration, copies, memsets and managed hints.

Copies follow CUDA's rules for where the host memory lives. Pinned and registered memory (and
device and managed memory) is copied when the scheduler reaches the copy; a pageable source is
read when ``cudaMemcpyAsync`` is called (CUDA stages it), and a pageable destination makes the
call wait for the copy. ``cudaMemset`` on device memory is asynchronous on the legacy stream.
``cudaFree`` and ``cudaFreeHost`` wait for the device first, as they do on a GPU.

The managed-memory hints come in the signatures of CUDA 12.0 (device numbers), 12.2-12.9 (the
``*_v2`` calls take a ``cudaMemLocation``) and 13 (the plain names take it), chosen by ``api``.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from tensorarena.memory.cuda.handles import stream_handle
from tensorarena.testing.cuda._errors import Failure, cudaError_t, cudaMemLocation
from tensorarena.testing.cuda._memory import Allocation, Memory
from tensorarena.testing.cuda._streams import Op, SimStream

__all__ = ["MemoryCalls"]

_ATTACH_GLOBAL, _ATTACH_HOST = 1, 2
_LOCATION_HOST = 2


class MemoryCalls:
    """Mixed into :class:`~tensorarena.testing.cuda.Simulator`: the memory calls."""

    memory: Memory
    advice: list[tuple[int, int, int, int]]
    prefetches: list[tuple[int, int, int, int]]

    if TYPE_CHECKING:  # provided by the Simulator they are mixed into

        def _call(self, name: str, body: Any, *args: Any, context: bool = True) -> tuple[Any, ...]:
            raise NotImplementedError

        def _current(self) -> int:
            raise NotImplementedError

        def stream(self, handle: Any) -> SimStream:
            raise NotImplementedError

        def enqueue(self, stream: SimStream, op: Op, inherited: Any = None) -> Op:
            raise NotImplementedError

        def sync_stream(self, stream: SimStream, upto: Op | None = None) -> None:
            raise NotImplementedError

        def sync_device(self, device: int) -> None:
            raise NotImplementedError

        def fault(self, device: int) -> None:
            raise NotImplementedError

    def _bind_hints(self, api: str) -> None:
        self.cudaMemAdvise: Any
        self.cudaMemPrefetchAsync: Any
        if api == "12.0":
            self.cudaMemAdvise = self._advise_by_device
            self.cudaMemPrefetchAsync = self._prefetch_by_device
            return
        self.cudaMemLocation = cudaMemLocation
        if api == "13":
            self.cudaMemAdvise = self._advise_by_location
            self.cudaMemPrefetchAsync = self._prefetch_by_location
        else:
            self.cudaMemAdvise = self._advise_by_device
            self.cudaMemPrefetchAsync = self._prefetch_by_device
            self.cudaMemAdvise_v2 = self._advise_by_location
            self.cudaMemPrefetchAsync_v2 = self._prefetch_by_location

    # --- allocation ----------------------------------------------------------------------------

    def cudaMalloc(self, size: int) -> tuple[Any, ...]:
        """Device memory on the current device."""
        return self._call("cudaMalloc", self._malloc, size)

    def _malloc(self, size: int) -> tuple[int]:
        allocation = self.memory.device_alloc(self._current(), _size(size))
        if allocation is None:
            raise Failure(cudaError_t.cudaErrorMemoryAllocation)
        return (allocation.address,)

    def cudaMallocManaged(self, size: int, flags: int = _ATTACH_GLOBAL) -> tuple[Any, ...]:
        """Managed memory, counted against the current device."""
        return self._call("cudaMallocManaged", self._malloc_mapped, size, flags, "managed")

    def cudaHostAlloc(self, size: int, flags: int = 0) -> tuple[Any, ...]:
        """Pinned host memory."""
        return self._call("cudaHostAlloc", self._malloc_mapped, size, 0, "host")

    def _malloc_mapped(self, size: int, flags: int, kind: str) -> tuple[int]:
        if kind == "managed" and int(flags) not in (_ATTACH_GLOBAL, _ATTACH_HOST):
            raise Failure(cudaError_t.cudaErrorInvalidValue)
        allocation = self.memory.mapped_alloc(self._current(), _size(size), kind)
        if allocation is None:
            raise Failure(cudaError_t.cudaErrorMemoryAllocation)
        return (allocation.address,)

    def cudaFree(self, address: int) -> tuple[Any, ...]:
        """Wait for the device, then free device or managed memory (0: nothing, success)."""
        return self._call("cudaFree", self._free, address, ("device", "managed"))

    def cudaFreeHost(self, address: int) -> tuple[Any, ...]:
        """Wait for the device, then free pinned host memory."""
        return self._call("cudaFreeHost", self._free, address, ("host",))

    def _free(self, address: int, kinds: tuple[str, ...]) -> tuple[()]:
        address = int(address)
        if address == 0 and "device" in kinds:
            return ()
        allocation = self.memory.live.get(address)
        if allocation is None or allocation.kind not in kinds:
            raise Failure(cudaError_t.cudaErrorInvalidValue)
        self.sync_device(allocation.device)
        self.memory.free(address, kinds)
        return ()

    def cudaHostRegister(self, address: int, size: int, flags: int) -> tuple[Any, ...]:
        """Page-lock a host range; an overlap with a registered one is error 712."""
        return self._call("cudaHostRegister", self._register, address, size, flags)

    def _register(self, address: int, size: int, flags: int) -> tuple[()]:
        address, size = int(address), _size(size)
        if address == 0 or size == 0 or self.memory.in_device_heap(address) is not None:
            raise Failure(cudaError_t.cudaErrorInvalidValue)
        if not self.memory.register(address, size, int(flags)):
            raise Failure(cudaError_t.cudaErrorHostMemoryAlreadyRegistered)
        return ()

    def cudaHostUnregister(self, address: int) -> tuple[Any, ...]:
        """Unregister a range by its start; error 713 when none starts there."""
        return self._call("cudaHostUnregister", self._unregister, address)

    def _unregister(self, address: int) -> tuple[()]:
        if not self.memory.unregister(int(address)):
            raise Failure(cudaError_t.cudaErrorHostMemoryNotRegistered)
        return ()

    # --- copies and memsets ----------------------------------------------------------------------

    def cudaMemcpy(self, dst: int, src: int, count: int, kind: Any) -> tuple[Any, ...]:
        """A copy on the legacy stream, waited for."""
        return self._call("cudaMemcpy", self._copy, dst, src, count, 0, True)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: Any,
                        stream: Any) -> tuple[Any, ...]:
        """A copy queued on ``stream``."""
        return self._call("cudaMemcpyAsync", self._copy, dst, src, count, stream, False)

    def _copy(self, dst: int, src: int, count: int, handle: Any, wait: bool) -> tuple[()]:
        dst, src, count = int(dst), int(src), _size(count)
        stream = self.stream(handle)
        target, source = self._side(dst, count), self._side(src, count)
        staged = ctypes.string_at(src, count) if source is None and count else None
        memory = self.memory

        def run() -> None:
            if not (memory.accessible(dst, count) and memory.accessible(src, count)):
                raise MemoryError("copy touches freed memory")
            if count:
                ctypes.memmove(dst, src if staged is None else staged, count)

        op = self.enqueue(stream, Op(
            f"copy of {count} bytes", run,
            reads=((src, count),) if source is not None else (),
            writes=((dst, count),) if target is not None else (),
        ))
        if wait or target is None:
            self.sync_stream(stream, op)
        return ()

    def _side(self, address: int, count: int) -> Allocation | None:
        """The allocation holding one side of a copy; None for pageable host memory."""
        if address == 0:
            raise Failure(cudaError_t.cudaErrorInvalidValue)
        owner = self.memory.owner(address, count)
        if owner is None and self.memory.ours(address, count):
            raise Failure(cudaError_t.cudaErrorInvalidValue)  # freed or out of bounds
        return owner

    def cudaMemset(self, address: int, value: int, count: int) -> tuple[Any, ...]:
        """A memset on the legacy stream (asynchronous for device memory)."""
        return self._call("cudaMemset", self._memset, address, value, count, 0)

    def cudaMemsetAsync(self, address: int, value: int, count: int,
                        stream: Any) -> tuple[Any, ...]:
        """A memset queued on ``stream``."""
        return self._call("cudaMemsetAsync", self._memset, address, value, count, stream)

    def _memset(self, address: int, value: int, count: int, handle: Any) -> tuple[()]:
        address, count = int(address), _size(count)
        stream = self.stream(handle)
        owner = self.memory.owner(address, count)
        if owner is None:
            raise Failure(cudaError_t.cudaErrorInvalidValue)
        memory = self.memory

        def run() -> None:
            if not memory.accessible(address, count):
                raise MemoryError("memset of freed memory")
            ctypes.memset(address, int(value), count)

        op = self.enqueue(stream, Op(f"memset of {count} bytes", run, writes=((address, count),)))
        if owner.kind != "device" and stream_handle(handle) == 0:
            self.sync_stream(stream, op)
        return ()

    # --- managed-memory hints --------------------------------------------------------------------

    def _managed(self, address: int, count: int) -> None:
        owner = self.memory.owner(int(address), _size(count))
        if owner is None or owner.kind != "managed":
            raise Failure(cudaError_t.cudaErrorInvalidValue)

    def _advise_by_device(self, address: int, count: int, advice: Any, device: Any
                          ) -> tuple[Any, ...]:
        if not isinstance(device, int):
            raise TypeError("cudaMemAdvise takes a device number in this CUDA version")
        return self._call("cudaMemAdvise", self._advise, address, count, advice, device)

    def _advise_by_location(self, address: int, count: int, advice: Any, location: Any
                            ) -> tuple[Any, ...]:
        if isinstance(location, int):
            raise TypeError("cudaMemAdvise takes a cudaMemLocation in this CUDA version")
        return self._call("cudaMemAdvise", self._advise, address, count, advice,
                          _target(location))

    def _advise(self, address: int, count: int, advice: Any, target: int) -> tuple[()]:
        self._managed(address, count)
        self.advice.append((int(address), int(count), int(advice), target))
        return ()

    def _prefetch_by_device(self, address: int, count: int, *args: Any) -> tuple[Any, ...]:
        if len(args) != 2 or not isinstance(args[0], int):
            raise TypeError("cudaMemPrefetchAsync(ptr, count, device, stream) in this version")
        return self._call("cudaMemPrefetchAsync", self._prefetch, address, count, *args)

    def _prefetch_by_location(self, address: int, count: int, *args: Any) -> tuple[Any, ...]:
        if len(args) != 3 or isinstance(args[0], int):
            raise TypeError("cudaMemPrefetchAsync(ptr, count, location, flags, stream) here")
        return self._call("cudaMemPrefetchAsync", self._prefetch, address, count,
                          _target(args[0]), args[2])

    def _prefetch(self, address: int, count: int, target: int, handle: Any) -> tuple[()]:
        self._managed(address, count)
        stream = self.stream(handle)
        self.enqueue(stream, Op(f"prefetch of {count} bytes"))
        self.prefetches.append((int(address), int(count), target,
                                stream_handle(handle)))
        return ()


def _size(value: Any) -> int:
    size = int(value)
    if size < 0:
        raise Failure(cudaError_t.cudaErrorInvalidValue)
    return size


def _target(location: Any) -> int:
    return -1 if int(location.type) == _LOCATION_HOST else int(location.id)
