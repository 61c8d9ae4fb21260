"""``stream_ordered_pool(device)``: the default resource of every GPU hook, reused in stream order.

The CuPy allocator, the Numba plugin, ``DeviceArray`` and PyTorch's pluggable allocator all free a
block when the *host* lets go of it, while kernels queued on a stream may still use it. A plain
device pool would hand the bytes to another stream at once; this pool is a
:class:`~tensorarena.adaptors.StreamOrdered` over the device's pool with CUDA events (per-stream
free lists; another stream gets a block only after the freeing stream's event), as CuPy's own pool
and RMM's are. ``stream=None`` is the legacy default stream (handle 0), which is where Numba and
CuPy run by default. One such pool exists per device pool, so every hook on a device shares it.
"""

from __future__ import annotations

import threading
import weakref

from tensorarena.adaptors import StreamOrdered
from tensorarena.memory.cuda import LEGACY_DEFAULT_STREAM, CudaEvents
from tensorarena.memory.devices import DevicePool, device_pool

__all__ = ["stream_ordered_pool"]

_lock = threading.Lock()
_pools: weakref.WeakKeyDictionary[DevicePool, StreamOrdered] = weakref.WeakKeyDictionary()


def stream_ordered_pool(device: int | None = None) -> StreamOrdered:
    """The stream-ordered pool over ``device_pool(device)`` (default: the current device)."""
    pool = device_pool(device)
    with _lock:
        found = _pools.get(pool)
        if found is None:
            found = StreamOrdered(pool, events=CudaEvents(), default_stream=LEGACY_DEFAULT_STREAM)
            _pools[pool] = found
        return found
