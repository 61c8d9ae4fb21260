"""The :class:`Simulator`: a stand-in for NVIDIA's ``cuda.bindings.runtime`` module.

It answers the calls :class:`~tensorarena.memory.cuda.CudaRuntime` makes with the bindings'
conventions (a tuple ``(cudaError_t, *outputs)``, handles as ints), over the memory of
:mod:`._memory` and the streams of :mod:`._streams`, and adds what a test needs to look inside:
the bytes (:meth:`Simulator.read`), kernels over them (:meth:`Simulator.launch`), the races found,
the primary contexts made, the calls made, and one-shot failures to inject (``sim.fail``).

Device state is per thread as in CUDA: each thread has a current device (0 until it sets one)
and a last error. A device's primary context is made by the first call that needs it (and by
``cudaSetDevice``, as in CUDA 12), so a test can assert a device was never touched. A kernel or
copy that touches NULL or freed memory poisons its device with ``cudaErrorIllegalAddress``: every
later call on that device returns it, as on a GPU.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tensorarena.errors import CudaError, InvalidAddressError, InvalidArgumentError
from tensorarena.memory.cuda.runtime import CudaRuntime
from tensorarena.sizes import Size, parse_size
from tensorarena.testing.cuda._errors import (
    Failure,
    cudaError_t,
    cudaMemcpyKind,
    cudaMemLocationType,
    cudaMemoryAdvise,
)
from tensorarena.testing.cuda._memory import Allocation, Memory
from tensorarena.testing.cuda._memory_calls import MemoryCalls
from tensorarena.testing.cuda._stream_calls import StreamCalls
from tensorarena.testing.cuda._streams import Op, Race, Scheduler

__all__ = ["API_VERSIONS", "Simulator"]

#: The CUDA versions whose managed-memory hint signatures the simulator can take.
API_VERSIONS = ("12.0", "12.2", "13")

Range = tuple[int, int]


class Simulator(MemoryCalls, StreamCalls):
    """A simulated CUDA runtime of ``devices`` GPUs with ``memory`` bytes each.

    Pass it to :class:`~tensorarena.memory.cuda.CudaRuntime` (or use :func:`simulated`, which
    installs it for the whole process). ``seed`` chooses the interleaving of queued work;
    ``api`` the CUDA version of the managed-memory hints; ``driver=False`` answers every call
    with ``cudaErrorInsufficientDriver``.
    """

    __name__ = "tensorarena.testing.cuda"
    cudaError_t = cudaError_t
    cudaMemcpyKind = cudaMemcpyKind
    cudaMemoryAdvise = cudaMemoryAdvise
    cudaMemLocationType = cudaMemLocationType

    def __init__(self, devices: int = 2, memory: Size = "256MiB", seed: int = 0, *,
                 api: str = "13", driver: bool = True) -> None:
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 0:
            raise InvalidArgumentError(f"devices must be a non-negative int, not {devices!r}")
        if api not in API_VERSIONS:
            raise InvalidArgumentError(f"api must be one of {', '.join(API_VERSIONS)}, not {api!r}")
        self.devices = devices
        self.capacity = parse_size(memory, name="memory")
        self.driver = driver
        self.memory = Memory(devices, self.capacity)
        self.scheduler = Scheduler(seed, self.fault)
        self.fail: dict[str, cudaError_t] = {}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.advice: list[tuple[int, int, int, int]] = []
        self.prefetches: list[tuple[int, int, int, int]] = []
        self.contexts = [0] * devices
        self.sticky: list[cudaError_t | None] = [None] * devices
        self._local = threading.local()
        self._handles = itertools.count(0x1000, 0x10)
        self._lock = threading.RLock()
        self._init_streams(devices)
        self._bind_hints(api)

    # --- plumbing ----------------------------------------------------------------------------

    def _current(self) -> int:
        return getattr(self._local, "device", 0)

    def _call(self, name: str, body: Callable[..., tuple[Any, ...]], *args: Any,
              context: bool = True) -> tuple[Any, ...]:
        with self._lock:
            self.calls.append((name, args))
            try:
                if not self.driver:
                    raise Failure(cudaError_t.cudaErrorInsufficientDriver)
                if name in self.fail:
                    raise Failure(self.fail.pop(name))
                if context and self.devices:
                    self._touch(self._current())
                outputs = body(*args)
            except Failure as failure:
                self._local.last = failure.status
                return (failure.status,)
            finally:
                self.scheduler.wander()
            return (cudaError_t.cudaSuccess, *outputs)

    def _touch(self, device: int) -> None:
        """Make ``device``'s primary context if need be; refuse work on a poisoned device."""
        if not self.contexts[device]:
            self.contexts[device] += 1
        self._check_sticky(device)

    def _check_sticky(self, device: int) -> None:
        status = self.sticky[device]
        if status is not None:
            raise Failure(status)

    def fault(self, device: int) -> None:
        """Poison ``device`` (an illegal address): its every later call fails."""
        self.sticky[device] = cudaError_t.cudaErrorIllegalAddress

    # --- the device calls --------------------------------------------------------------------

    def cudaGetDeviceCount(self) -> tuple[Any, ...]:
        """How many devices; cudaErrorNoDevice for none."""
        return self._call("cudaGetDeviceCount", self._device_count, context=False)

    def _device_count(self) -> tuple[int]:
        if not self.devices:
            raise Failure(cudaError_t.cudaErrorNoDevice)
        return (self.devices,)

    def cudaGetDevice(self) -> tuple[Any, ...]:
        """The calling thread's current device (makes no context)."""
        return self._call("cudaGetDevice", lambda: (self._current(),), context=False)

    def cudaSetDevice(self, device: int) -> tuple[Any, ...]:
        """Make ``device`` current for the thread (and its context, as CUDA 12 does)."""
        return self._call("cudaSetDevice", self._set_device, device, context=False)

    def _set_device(self, device: int) -> tuple[()]:
        if not 0 <= int(device) < self.devices:
            raise Failure(cudaError_t.cudaErrorInvalidDevice)
        self._local.device = int(device)
        self.contexts[int(device)] = self.contexts[int(device)] or 1
        return ()

    def cuDevicePrimaryCtxGetState(self, device: int) -> tuple[Any, ...]:
        """The driver call: ``(CUDA_SUCCESS, flags, active)``; makes no context."""
        with self._lock:
            self.calls.append(("cuDevicePrimaryCtxGetState", (device,)))
            if not 0 <= int(device) < self.devices:
                return (cudaError_t.cudaErrorInvalidDevice,)
            return (cudaError_t.cudaSuccess, 0, bool(self.contexts[int(device)]))

    def cudaMemGetInfo(self) -> tuple[Any, ...]:
        """``(free, total)`` of the current device."""
        return self._call("cudaMemGetInfo", self._mem_get_info)

    def _mem_get_info(self) -> tuple[int, int]:
        device = self._current()
        used = self.memory.heaps[device].used + self.memory.managed_used[device]
        return self.capacity - used, self.capacity

    def cudaDeviceSynchronize(self) -> tuple[Any, ...]:
        """Run everything queued on the current device."""
        return self._call("cudaDeviceSynchronize", self._device_sync)

    def _device_sync(self) -> tuple[()]:
        self.sync_device(self._current())
        return ()

    def cudaGetLastError(self) -> tuple[Any, ...]:
        """The thread's last error (a sticky one stays), cleared."""
        with self._lock:
            self.calls.append(("cudaGetLastError", ()))
            status = getattr(self._local, "last", cudaError_t.cudaSuccess)
            self._local.last = cudaError_t.cudaSuccess
            sticky = self.sticky[self._current()] if self.devices else None
            return (sticky or status,)

    def cudaGetErrorName(self, error: Any) -> tuple[Any, ...]:
        """The status's name, as bytes."""
        return cudaError_t.cudaSuccess, cudaError_t(int(error)).name.encode()

    # --- for tests -----------------------------------------------------------------------------

    @property
    def runtime(self) -> CudaRuntime:
        """A :class:`~tensorarena.memory.cuda.CudaRuntime` over this simulator."""
        return CudaRuntime(self)

    @property
    def races(self) -> list[Race]:
        """Every race found so far, in the order found."""
        return self.scheduler.races

    @property
    def used(self) -> list[int]:
        """Bytes of device (and managed) memory in use, per device."""
        return [self.memory.heaps[d].used + self.memory.managed_used[d]
                for d in range(self.devices)]

    @property
    def registered(self) -> dict[int, int]:
        """Registered host ranges: start -> bytes."""
        return {a.address: a.nbytes for a in self.memory.live.values() if a.kind == "registered"}

    def live(self) -> dict[int, Allocation]:
        """Every live allocation (device, managed, host, registered), by address."""
        return dict(self.memory.live)

    def names(self) -> list[str]:
        """The calls made so far, in order."""
        return [name for name, _ in self.calls]

    def read(self, address: int, nbytes: int) -> bytes:
        """The bytes at ``address`` now (queued work not run): memory the simulator made."""
        with self._lock:
            self._check_range(address, nbytes)
            return ctypes.string_at(address, nbytes)

    def write(self, address: int, data: bytes) -> None:
        """Write ``data`` from the host; unfinished work on those bytes is a race."""
        with self._lock:
            self._check_range(address, len(data))
            self.scheduler.check_races("host write", ((), ((address, len(data)),)), {})
            ctypes.memmove(address, data, len(data))

    def _check_range(self, address: int, nbytes: int) -> None:
        if self.memory.owner(address, nbytes) is None:
            raise InvalidAddressError(
                f"{nbytes} bytes at {address:#x} are not in one live allocation of the simulator",
                address=address,
            )

    def launch(self, stream: Any, fn: Callable[..., None], *, reads: Iterable[Range] = (),
               writes: Iterable[Range] = ()) -> None:
        """Queue a kernel on ``stream`` (a handle or a stream object): ``fn(*views)`` runs later
        with one writable ``memoryview`` per range, ``reads`` first, then ``writes``.

        A range that is NULL or not live when the kernel runs poisons the device instead.
        Raises :class:`~tensorarena.errors.CudaError` when the launch itself fails. ``fn`` runs
        with the simulator's lock held (any thread's call may run it): it may call the
        simulator, but must not wait for another thread that does.
        """
        read_ranges, write_ranges = _ranges(reads), _ranges(writes)
        status = self._call("cudaLaunchKernel", self._launch, stream, fn, read_ranges,
                            write_ranges)[0]
        if status != cudaError_t.cudaSuccess:
            raise CudaError("cudaLaunchKernel", int(status), status.name)

    def _launch(self, handle: Any, fn: Callable[..., None], reads: tuple[Range, ...],
                writes: tuple[Range, ...]) -> tuple[()]:
        stream = self.stream(handle)
        if stream.device != self._current():
            raise Failure(cudaError_t.cudaErrorInvalidResourceHandle)
        memory = self.memory

        def run() -> None:
            views = []
            for address, nbytes in reads + writes:
                if address == 0 or memory.owner(address, nbytes) is None:
                    raise MemoryError(f"kernel touches {address:#x}")
                views.append(memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B"))
            fn(*views)

        self.enqueue(stream, Op(f"kernel {getattr(fn, '__name__', 'fn')}", run, reads, writes))
        return ()

    def synchronize(self) -> None:
        """Run every queued op of every device (the host waits for all of them)."""
        with self._lock:
            for stream in list(self.scheduler.streams):
                target = stream.queued
                if self.scheduler.run_until(lambda s=stream, t=target: s.done >= t):  # type: ignore[misc]
                    self.scheduler.seen(stream, target)

    def hold(self, stream: Any, held: bool = True) -> None:
        """Stop (or, ``held=False``, let go) a stream's work, as a long kernel would: its ops
        stay queued, so a test can look at the state while they are pending."""
        with self._lock:
            self.stream(stream).held = held

    def close(self) -> None:
        """Let held streams go, run what is queued, and forget every allocation."""
        with self._lock:
            for stream in self.scheduler.streams:
                stream.held = False
            self.synchronize()
            self.memory.close()

    def __repr__(self) -> str:
        return (f"Simulator(devices={self.devices}, memory={self.capacity}, "
                f"live={len(self.memory.live)}, races={len(self.races)})")


def _ranges(ranges: Iterable[Sequence[int]]) -> tuple[Range, ...]:
    out = []
    for item in ranges:
        address, nbytes = (int(v) for v in item)
        if nbytes < 0:
            raise InvalidArgumentError(f"a range's size is non-negative, not {nbytes}")
        out.append((address, nbytes))
    return tuple(out)
