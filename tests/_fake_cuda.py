"""A fake of NVIDIA's ``cuda.bindings.runtime`` module, for the CUDA layer's tests on the CPU.

Same conventions as the real bindings: every function returns a tuple ``(cudaError_t, *outputs)``;
handles are ints; enums are ``IntEnum`` members. Behind it:

* "device" memory is real host memory (one ctypes buffer per allocation, each device with its own
  capacity), so copies between device and host addresses really move bytes;
* each stream is a :class:`~tensorarena.streams.CpuStream` (handle 0 is the legacy default), so
  ``cudaMemcpyAsync`` is asynchronous for real and events complete when their stream gets there;
* ``fail["cudaFree"] = cudaError_t.cudaErrorInvalidValue`` makes the next call of that function
  return the error (once), so every status-checking path can be driven;
* ``legacy=True`` gives CUDA 12.0's hint signatures (device numbers, no cudaMemLocation).
"""

from __future__ import annotations

import ctypes
import enum
import itertools
import threading
from typing import Any

from tensorarena.streams import CpuStream, Fence


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorNotReady = 600
    cudaErrorHostMemoryAlreadyRegistered = 712
    cudaErrorHostMemoryNotRegistered = 713


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyDefault = 4


class cudaMemoryAdvise(enum.IntEnum):
    cudaMemAdviseSetReadMostly = 1
    cudaMemAdviseUnsetReadMostly = 2
    cudaMemAdviseSetPreferredLocation = 3
    cudaMemAdviseUnsetPreferredLocation = 4
    cudaMemAdviseSetAccessedBy = 5
    cudaMemAdviseUnsetAccessedBy = 6


class cudaMemLocationType(enum.IntEnum):
    cudaMemLocationTypeDevice = 1
    cudaMemLocationTypeHost = 2


class cudaMemLocation:
    def __init__(self) -> None:
        self.type: Any = 0
        self.id = 0


OK = cudaError_t.cudaSuccess
MiB = 1 << 20


class FakeCudart:
    """The fake module (an instance: each test gets its own devices and streams)."""

    __name__ = "fake_cudart"
    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaMemoryAdvise = cudaMemoryAdvise
    cudaMemLocationType = cudaMemLocationType

    def __init__(self, devices: int = 2, capacity: int = 64 * MiB, *, legacy: bool = False,
                 driver: bool = True) -> None:
        self.devices = devices
        self.capacity = capacity
        self.driver = driver
        self.legacy = legacy
        if not legacy:
            self.cudaMemLocation = cudaMemLocation
        self.fail: dict[str, cudaError_t] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.used = [0] * devices
        self.current = threading.local()
        self.buffers: dict[int, tuple[Any, int, str, int]] = {}  # address -> (buf, size, kind, dev)
        self.registered: dict[int, int] = {}
        self.advice: list[tuple[int, int, int, int]] = []
        self.prefetches: list[tuple[int, int, int, int]] = []
        self._handles = itertools.count(0x1000, 0x10)
        self.streams: dict[int, CpuStream] = {0: CpuStream("fake-default")}
        self.events: dict[int, Fence | None] = {}
        self.lock = threading.Lock()

    # --- plumbing ----------------------------------------------------------------------------

    def _enter(self, name: str, *args: Any) -> cudaError_t:
        self.calls.append((name, args))
        if not self.driver:
            return cudaError_t.cudaErrorInsufficientDriver
        return self.fail.pop(name, OK)

    def _device(self) -> int:
        return getattr(self.current, "device", 0)

    def _buffer(self, size: int, kind: str, device: int) -> int:
        buffer = ctypes.create_string_buffer(size + 4096)
        address = (ctypes.addressof(buffer) + 4095) & -4096
        self.buffers[address] = (buffer, size, kind, device)
        return address

    def cudaGetLastError(self) -> tuple[cudaError_t]:
        self.calls.append(("cudaGetLastError", ()))
        return (OK,)

    def cudaGetErrorName(self, error: Any) -> tuple[cudaError_t, bytes]:
        return OK, cudaError_t(int(error)).name.encode()

    # --- devices -------------------------------------------------------------------------------

    def cudaGetDeviceCount(self) -> tuple[cudaError_t, int]:
        status = self._enter("cudaGetDeviceCount")
        if status == OK and self.devices == 0:
            return cudaError_t.cudaErrorNoDevice, 0
        return status, self.devices

    def cudaGetDevice(self) -> tuple[cudaError_t, int]:
        return self._enter("cudaGetDevice"), self._device()

    def cudaSetDevice(self, device: int) -> tuple[cudaError_t]:
        status = self._enter("cudaSetDevice", device)
        if status == OK and not 0 <= device < self.devices:
            return (cudaError_t.cudaErrorInvalidDevice,)
        if status == OK:
            self.current.device = device
        return (status,)

    def cudaMemGetInfo(self) -> tuple[cudaError_t, int, int]:
        status = self._enter("cudaMemGetInfo")
        device = self._device()
        return status, self.capacity - self.used[device], self.capacity

    def cudaDeviceSynchronize(self) -> tuple[cudaError_t]:
        status = self._enter("cudaDeviceSynchronize")
        for stream in list(self.streams.values()):
            stream.synchronize()
        return (status,)

    # --- memory --------------------------------------------------------------------------------

    def _malloc(self, name: str, size: int, kind: str) -> tuple[cudaError_t, int]:
        status = self._enter(name, size)
        if status != OK:
            return status, 0
        device = self._device()
        with self.lock:
            if kind != "host" and self.used[device] + size > self.capacity:
                return cudaError_t.cudaErrorMemoryAllocation, 0
            if kind != "host":
                self.used[device] += size
            return OK, self._buffer(size, kind, device)

    def cudaMalloc(self, size: int) -> tuple[cudaError_t, int]:
        return self._malloc("cudaMalloc", size, "device")

    def cudaMallocManaged(self, size: int, flags: int) -> tuple[cudaError_t, int]:
        assert flags == 1, "attached globally"
        return self._malloc("cudaMallocManaged", size, "managed")

    def cudaHostAlloc(self, size: int, flags: int) -> tuple[cudaError_t, int]:
        return self._malloc("cudaHostAlloc", size, "host")

    def _free(self, name: str, address: int, kinds: tuple[str, ...]) -> tuple[cudaError_t]:
        status = self._enter(name, address)
        if status != OK:
            return (status,)
        with self.lock:
            entry = self.buffers.get(address)
            if entry is None or entry[2] not in kinds:
                return (cudaError_t.cudaErrorInvalidValue,)
            del self.buffers[address]
            if entry[2] != "host":
                self.used[entry[3]] -= entry[1]
        return (OK,)

    def cudaFree(self, address: int) -> tuple[cudaError_t]:
        return self._free("cudaFree", address, ("device", "managed"))

    def cudaFreeHost(self, address: int) -> tuple[cudaError_t]:
        return self._free("cudaFreeHost", address, ("host",))

    def cudaHostRegister(self, address: int, size: int, flags: int) -> tuple[cudaError_t]:
        status = self._enter("cudaHostRegister", address, size, flags)
        if status == OK and address in self.registered:
            return (cudaError_t.cudaErrorHostMemoryAlreadyRegistered,)
        if status == OK:
            self.registered[address] = size
        return (status,)

    def cudaHostUnregister(self, address: int) -> tuple[cudaError_t]:
        status = self._enter("cudaHostUnregister", address)
        if status == OK and self.registered.pop(address, None) is None:
            return (cudaError_t.cudaErrorHostMemoryNotRegistered,)
        return (status,)

    def cudaMemcpy(self, dst: int, src: int, count: int, kind: Any) -> tuple[cudaError_t]:
        status = self._enter("cudaMemcpy", dst, src, count, kind)
        if status == OK:
            self.cudaDeviceSynchronize()
            ctypes.memmove(dst, src, count)
        return (status,)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: Any,
                        stream: int) -> tuple[cudaError_t]:
        status = self._enter("cudaMemcpyAsync", dst, src, count, kind, stream)
        if status == OK:
            self.streams[int(stream)].submit(ctypes.memmove, dst, src, count)
        return (status,)

    def cudaMemset(self, address: int, value: int, count: int) -> tuple[cudaError_t]:
        status = self._enter("cudaMemset", address, value, count)
        if status == OK:
            ctypes.memset(address, value, count)
        return (status,)

    # --- hints: CUDA 13's location form, or 12.0's device numbers with legacy=True ------------

    def cudaMemAdvise(self, address: int, count: int, advice: Any,
                      where: Any) -> tuple[cudaError_t]:
        if self.legacy != isinstance(where, int):
            raise TypeError("wrong argument type for this CUDA version")
        status = self._enter("cudaMemAdvise", address, count, advice, where)
        target = where if self.legacy else (-1 if where.type == 2 else where.id)
        self.advice.append((address, count, int(advice), target))
        return (status,)

    def cudaMemPrefetchAsync(self, address: int, count: int, *args: Any) -> tuple[cudaError_t]:
        if self.legacy:
            if len(args) != 2:
                raise TypeError("cudaMemPrefetchAsync takes 4 arguments on CUDA 12.0")
            target, stream = args
        else:
            if len(args) != 3:
                raise TypeError("cudaMemPrefetchAsync takes 5 arguments on CUDA 13")
            location, _flags, stream = args
            target = -1 if location.type == 2 else location.id
        status = self._enter("cudaMemPrefetchAsync", address, count, *args)
        self.prefetches.append((address, count, target, int(stream)))
        return (status,)

    # --- streams and events ----------------------------------------------------------------------

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[cudaError_t, int]:
        status = self._enter("cudaStreamCreateWithFlags", flags)
        if status != OK:
            return status, 0
        handle = next(self._handles)
        self.streams[handle] = CpuStream(f"fake-{handle:#x}")
        return OK, handle

    def cudaStreamDestroy(self, stream: int) -> tuple[cudaError_t]:
        status = self._enter("cudaStreamDestroy", stream)
        if status == OK:
            self.streams.pop(int(stream)).close()
        return (status,)

    def cudaStreamSynchronize(self, stream: int) -> tuple[cudaError_t]:
        status = self._enter("cudaStreamSynchronize", stream)
        if status == OK:
            self.streams[int(stream)].synchronize()
        return (status,)

    def cudaStreamWaitEvent(self, stream: int, event: int, flags: int) -> tuple[cudaError_t]:
        status = self._enter("cudaStreamWaitEvent", stream, event, flags)
        fence = self.events[int(event)]
        if status == OK and fence is not None:
            self.streams[int(stream)].wait(fence)
        return (status,)

    def cudaEventCreateWithFlags(self, flags: int) -> tuple[cudaError_t, int]:
        status = self._enter("cudaEventCreateWithFlags", flags)
        if status != OK:
            return status, 0
        handle = next(self._handles)
        self.events[handle] = None
        return OK, handle

    def cudaEventRecord(self, event: int, stream: int) -> tuple[cudaError_t]:
        status = self._enter("cudaEventRecord", event, stream)
        if status == OK:
            self.events[int(event)] = self.streams[int(stream)].record()
        return (status,)

    def cudaEventQuery(self, event: int) -> tuple[cudaError_t]:
        status = self._enter("cudaEventQuery", event)
        fence = self.events[int(event)]
        if status == OK and fence is not None and not fence.query():
            return (cudaError_t.cudaErrorNotReady,)
        return (status,)

    def cudaEventSynchronize(self, event: int) -> tuple[cudaError_t]:
        status = self._enter("cudaEventSynchronize", event)
        fence = self.events[int(event)]
        if status == OK and fence is not None:
            fence.synchronize()
        return (status,)

    def cudaEventDestroy(self, event: int) -> tuple[cudaError_t]:
        status = self._enter("cudaEventDestroy", event)
        if status == OK:
            del self.events[int(event)]
        return (status,)

    def names(self) -> list[str]:
        """The functions called so far, in order."""
        return [name for name, _ in self.calls]

    def close(self) -> None:
        for stream in list(self.streams.values()):
            stream.close()
