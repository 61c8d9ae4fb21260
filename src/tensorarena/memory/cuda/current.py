"""``block_device(device)``: the device a block lives on, made current around the code freeing it.

A free can run anywhere: PyTorch's allocator hands a block back with the device and stream it was
allocated on without switching device, CuPy's and Numba's finalizers run in whatever thread and
on whatever device the garbage collector happens to be. A stream-ordered free records an event on
the block's stream, and CUDA refuses to record an event of one device on another device's stream,
so every free path makes the block's device current first and restores the previous one after
(as RMM's and PyTorch's allocators do). Restoring follows :meth:`CudaRuntime.on_device`: a device
whose context does not exist yet is not made current again, so no context is ever created on a
device the thread did not use. Without a CUDA runtime (no bindings, no device) it does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tensorarena.memory.cuda.runtime import cuda_available, cuda_runtime

__all__ = ["block_device"]


@contextlib.contextmanager
def block_device(device: int | None) -> Iterator[None]:
    """Make ``device`` current for the block when there is a CUDA runtime (``None``: the
    device is unknown, nothing is switched)."""
    if device is None or not cuda_available():
        yield
        return
    with cuda_runtime().on_device(device):
        yield
