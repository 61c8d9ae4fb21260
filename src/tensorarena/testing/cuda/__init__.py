"""A strict simulated CUDA runtime, to test stream and memory logic without a GPU.

::

    from tensorarena.testing.cuda import simulated

    with simulated(devices=2, memory="256MiB", seed=0) as sim:
        pool = tensorarena.memory.device_pool(1)      # cudaMalloc on simulated device 1
        ...
        sim.launch(stream, kernel, reads=[(a, n)], writes=[(b, n)])
        sim.synchronize()
        assert sim.read(b, n) == expected and not sim.races
        assert sim.contexts[0] == 0                   # device 0 was never touched

Inside the block every tensorarena CUDA resource, stream, event and hook talks to the simulator
instead of NVIDIA's bindings (NumPy is all it needs). What it models, and so what it can catch:

* **devices and contexts**: real bytes per device (``sim.read``), a current device per thread,
  primary contexts made on first use and counted per device (``sim.contexts``);
* **streams and events of a device**: recording an event on another device's stream fails as in
  CUDA, waiting across devices works; the legacy default stream (0) orders with blocking streams
  and not with non-blocking ones; the per-thread default stream (2) exists;
* **asynchronous work**: copies, memsets, prefetches and kernels (``sim.launch``) queue per stream
  and run later in stream order, in an interleaving chosen by ``seed``, and at synchronisation
  points; two unordered accesses to the same bytes (one a write) are recorded in ``sim.races``;
* **memory calls and errors**: cudaMalloc/Free, HostAlloc/FreeHost, HostRegister/Unregister (an
  overlap is error 712), MallocManaged with MemAdvise and MemPrefetchAsync in the signatures of
  CUDA 12.0, 12.2-12.9 and 13 (``api=``), MemGetInfo, out of memory, injected failures
  (``sim.fail["cudaMalloc"] = cudaError_t.cudaErrorInvalidValue``), and sticky errors: a kernel
  or copy touching NULL or freed memory poisons its device, as on a GPU.

What it does not model: timing, peer-access enabling, graphs and capture, IPC, memory pools of
the driver (``cudaMallocAsync``), and host code reading device memory directly (addresses are
real host memory, so such a read succeeds here and would crash on a GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tensorarena.memory import set_device_registry
from tensorarena.memory.cuda.runtime import set_cuda_runtime
from tensorarena.sizes import Size
from tensorarena.testing.cuda._errors import cudaError_t, cudaMemLocation
from tensorarena.testing.cuda._memory import Allocation
from tensorarena.testing.cuda._simulator import API_VERSIONS, Simulator
from tensorarena.testing.cuda._streams import Race

__all__ = [
    "API_VERSIONS",
    "Allocation",
    "Race",
    "Simulator",
    "cudaError_t",
    "cudaMemLocation",
    "simulated",
]


@contextlib.contextmanager
def simulated(devices: int = 2, memory: Size = "256MiB", seed: int = 0, *,
              api: str = "13") -> Iterator[Simulator]:
    """Run the block's CUDA calls on a fresh :class:`Simulator` (the process's runtime and
    device registry are replaced, and put back after; queued work is run at the end)."""
    sim = Simulator(devices, memory, seed, api=api)
    previous_runtime = set_cuda_runtime(sim.runtime)
    previous_registry = set_device_registry(None)
    try:
        yield sim
    finally:
        set_device_registry(previous_registry)
        set_cuda_runtime(previous_runtime)
        sim.synchronize()
