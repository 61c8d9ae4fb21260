"""CUDA memory: device, managed and driver-pinned host memory, streams and events.

Thin layers over :class:`~tensorarena.memory.cuda.runtime.CudaRuntime`, the one module that calls
NVIDIA's ``cuda-python`` bindings (the ``cuda`` extra, imported on first use: importing this
package needs no GPU and no bindings).

    CudaMemory(device)              cudaMalloc / cudaFree: the upstream of a device pool
    ManagedMemory(device)           cudaMallocManaged, with advise() and prefetch()
    CudaHostAllocBackend()          PinnedHostMemory backend: cudaHostAlloc (DMA-registered)
    CudaRegisterBackend()           PinnedHostMemory backend: mmap + cudaHostRegister
    register(array)                 cudaHostRegister existing host memory while open
    CudaStream, CudaEvent           the protocols of tensorarena.streams, on the GPU
    CudaEvents(runtime)             an EventSource for raw stream handles (torch, CuPy)
"""

from tensorarena.memory.cuda.device import CUDA_MALLOC_ALIGNMENT, CudaMemory
from tensorarena.memory.cuda.managed import ADVICE, Advice, ManagedMemory
from tensorarena.memory.cuda.pinning import (
    CudaHostAllocBackend,
    CudaRegisterBackend,
    HostRegistration,
    register,
)
from tensorarena.memory.cuda.runtime import (
    CPU_DEVICE,
    CudaRuntime,
    cuda_available,
    cuda_runtime,
    handle_value,
    set_cuda_runtime,
    stream_handle,
)
from tensorarena.memory.cuda.streams import (
    LEGACY_DEFAULT_STREAM,
    PER_THREAD_DEFAULT_STREAM,
    CudaEvent,
    CudaEvents,
    CudaStream,
    idle_events,
)

__all__ = [
    "ADVICE",
    "CPU_DEVICE",
    "CUDA_MALLOC_ALIGNMENT",
    "LEGACY_DEFAULT_STREAM",
    "PER_THREAD_DEFAULT_STREAM",
    "Advice",
    "CudaEvent",
    "CudaEvents",
    "CudaHostAllocBackend",
    "CudaMemory",
    "CudaRegisterBackend",
    "CudaRuntime",
    "CudaStream",
    "HostRegistration",
    "ManagedMemory",
    "cuda_available",
    "cuda_runtime",
    "handle_value",
    "idle_events",
    "register",
    "set_cuda_runtime",
    "stream_handle",
]
