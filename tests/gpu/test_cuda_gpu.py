"""The GPU layer on a real GPU: CUDA memory, managed memory, driver pinning, stream-ordered reuse
under real kernels, transfers, and the CuPy, Numba and PyTorch hooks.

Marked ``gpu`` and skipped, with the reason, where the CUDA bindings or a device are missing.
``scripts/gpu_check.sh`` runs them on the lent GPU machine (``pytest -m gpu``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.adaptors import StreamOrdered
from tensorarena.errors import OutOfMemoryError
from tensorarena.memory import PinnedHostMemory, Pool
from tensorarena.memory.cuda import (
    CudaEvents,
    CudaMemory,
    ManagedMemory,
    cuda_available,
    cuda_runtime,
    register,
)


def _why_not() -> str | None:
    if importlib.util.find_spec("cuda") is None:
        return "the CUDA bindings (cuda-python, the 'cuda' extra) are not installed"
    if not cuda_available():
        return "no CUDA device is visible to the CUDA runtime"
    return None


_REASON = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]
MiB = 1 << 20


def _torch():  # type: ignore[no-untyped-def]
    return pytest.importorskip("torch")


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter (hooks that must be set before CUDA starts)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=180, env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_device_memory_holds_bytes_and_out_of_memory_changes_nothing() -> None:
    runtime = cuda_runtime()
    memory = CudaMemory()
    address = memory.allocate(64 * MiB)
    runtime.memset(address, 0x5A, 64 * MiB)
    host = np.empty(64 * MiB, np.uint8)
    runtime.memcpy(host.ctypes.data, address, 64 * MiB)
    assert (host == 0x5A).all()
    before = memory.statistics()
    _, total = memory.mem_info()
    with pytest.raises(OutOfMemoryError, match="cudaErrorMemoryAllocation"):
        memory.allocate(4 * total)
    assert memory.statistics().allocations == before.allocations
    memory.deallocate(address, 64 * MiB)


def test_device_arrays_are_shared_with_torch_without_a_copy() -> None:
    _torch()
    array = ta.device_empty((1024, 1024), np.float32)  # from stream_ordered_pool()
    tensor = array.to_torch()
    assert tensor.data_ptr() == array.address and tensor.device.type == "cuda"
    tensor.fill_(2.0)
    assert float(tensor.sum()) == 2.0 * 1024 * 1024
    pool = array.resource
    del array, tensor
    import gc

    gc.collect()
    assert pool.live_blocks() == {}
    pool.synchronize()  # type: ignore[attr-defined]  # back once the stream passed the free
    assert pool.upstream.statistics().allocations.current == 0  # type: ignore[attr-defined]


class _View:
    """The CUDA array interface of a host array over managed memory (it owns nothing)."""

    def __init__(self, array: np.ndarray) -> None:  # type: ignore[type-arg]
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "version": 3,
            "data": (array.ctypes.data, False), "strides": None, "stream": None,
        }


def test_managed_memory_moves_between_host_and_device_with_hints() -> None:
    torch = _torch()
    managed = ManagedMemory()
    host = ta.empty(4 * MiB, np.float32, resource=managed)  # 16 MiB the host writes
    host[:] = 1.0
    address = host.ctypes.data
    managed.advise(address, host.nbytes, "read_mostly")
    managed.prefetch(address, host.nbytes)  # to the device, on the default stream
    device = torch.as_tensor(_View(host), device="cuda")  # the same bytes, seen by the GPU
    assert float(device.sum()) == 4 * MiB
    device.mul_(3.0)
    managed.prefetch(address, host.nbytes, "cpu")
    torch.cuda.synchronize()
    assert float(host[:10].sum()) == 30.0
    managed.advise(address, host.nbytes, "unset_read_mostly")


def test_pinned_memory_is_driver_pinned_and_existing_memory_registers() -> None:
    pinned = PinnedHostMemory()
    assert pinned.dma_registered, repr(pinned)
    address = pinned.allocate(MiB)
    ctypes.memset(address, 1, MiB)
    pinned.deallocate(address, MiB)
    array = np.zeros(MiB, np.uint8)
    with register(array) as registration:
        assert registration.open


def test_stream_ordered_reuse_under_real_kernels() -> None:
    torch = _torch()
    pool = StreamOrdered(Pool(CudaMemory()), events=CudaEvents())
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    n = 8 * MiB
    block = pool.allocate(4 * n, stream=first.cuda_stream)
    with torch.cuda.stream(first):
        tensor = torch.as_tensor(ta.interop.DeviceArray(pool, block, (n,), np.dtype(np.float32),
                                                        stream=first.cuda_stream), device="cuda")
        torch.cuda._sleep(1_000_000_000)  # keep the first stream busy (~0.5 s)
        tensor.fill_(1.0)
        total = tensor.sum()
    del tensor  # the DeviceArray frees the block on the first stream, while it still works
    import gc

    gc.collect()
    other = pool.allocate(4 * n, stream=second.cuda_stream)
    assert other != block, "another stream must not get the block while the first works on it"
    again = pool.allocate(4 * n, stream=first.cuda_stream)
    assert again == block, "the same stream reuses it at once: stream order makes it safe"
    torch.cuda.synchronize()
    assert float(total) == n
    pool.deallocate(other, 4 * n, second.cuda_stream)
    pool.deallocate(again, 4 * n, first.cuda_stream)
    torch.cuda.synchronize()
    assert pool.synchronize() > 0 and pool.statistics().same_stream_reuses == 1


def test_transfers_round_trip_through_the_pinned_pool() -> None:
    data = np.random.default_rng(0).standard_normal(16 * MiB // 8)
    on_device = ta.to_device(data)
    back = ta.to_host(on_device)
    assert np.array_equal(back, data)


def test_cupy_allocates_from_our_pool() -> None:
    cupy = pytest.importorskip("cupy")
    from tensorarena.interop.cupy_allocator import use_with_cupy

    pool = Pool(CudaMemory())
    with use_with_cupy(pool):
        array = cupy.arange(1_000_000, dtype=cupy.float64)
        assert pool.statistics().allocations.current >= 1
        assert float(array.sum()) == 999_999 * 1_000_000 / 2
        del array
    cupy.cuda.Device().synchronize()
    assert pool.statistics().allocations.current == 0


def test_numba_allocates_through_the_plugin() -> None:
    pytest.importorskip("numba.cuda")
    out = _run("""
        import os
        os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "tensorarena.interop.numba_emm"
        import numpy as np
        from numba import cuda
        from tensorarena.memory import device_pool
        array = cuda.to_device(np.arange(1000, dtype=np.int64))
        print(device_pool().statistics().allocations.current, int(array.copy_to_host().sum()))
    """)
    live, total = out.split()
    assert int(live) >= 1 and int(total) == 999 * 1000 // 2


def test_torch_allocations_go_through_the_pluggable_allocator() -> None:
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip(f"torch {torch.__version__} has no torch.cuda.MemPool")
    out = _run("""
        import torch
        from tensorarena.interop.torch_allocator import TorchAllocator, build_shim, find_shim
        allocator = TorchAllocator(shim=find_shim() or build_shim())
        with torch.cuda.use_mem_pool(allocator.mem_pool()):
            x = torch.randn(1 << 20, device="cuda")
            y = (x * 2).sum()
        torch.cuda.synchronize()
        print(allocator.allocations, allocator.failures, float(y - 2 * x.sum()) < 1e-2)
    """)
    allocations, failures, close = out.split()
    assert int(allocations) >= 2 and int(failures) == 0 and close == "True"


def test_torch_mem_pool_served_by_our_allocator() -> None:
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool"):
        pytest.skip(f"torch {torch.__version__} has no torch.cuda.MemPool")
    out = _run("""
        import torch
        from tensorarena.interop.torch_allocator import TorchAllocator, build_shim, find_shim
        allocator = TorchAllocator(shim=find_shim() or build_shim())
        pool = allocator.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            x = torch.ones(1 << 20, device="cuda")
        print(allocator.allocations, float(x.sum()))
    """)
    allocations, total = out.split()
    assert int(allocations) >= 1 and float(total) == 1 << 20
