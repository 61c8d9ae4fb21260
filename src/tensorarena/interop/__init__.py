"""Arrays on top of resources: NumPy arrays and PyTorch tensors whose bytes come from a resource.

Device arrays (``device_empty``, ``DeviceArray``) share device bytes with CuPy, Numba and PyTorch
through ``__cuda_array_interface__``; ``to_device``/``to_host`` copy through pinned staging
buffers; the hooks that route CuPy's, Numba's and PyTorch's own allocations through our pools are
in ``interop.cupy_allocator``, ``interop.numba_emm`` and ``interop.torch_allocator``.

``empty``/``zeros`` take the bytes from a resource (the default: a thread-safe pool over mmap) and
give them back when the array and all its views are garbage-collected; ``scope()`` bounds the
lifetime of every array made inside a block. PyTorch is imported only for ``like="torch"``.
"""

from tensorarena.interop._entry import compiled_entry
from tensorarena.interop.arrays import empty as _python_empty
from tensorarena.interop.arrays import zeros
from tensorarena.interop.default import default_resource, set_default_resource
from tensorarena.interop.device_arrays import DeviceArray, device_empty
from tensorarena.interop.empty_cache import empty_cache
from tensorarena.interop.owner import Allocation
from tensorarena.interop.scope import Scope, ScopeEscapeError, current_scope, scope
from tensorarena.interop.transfers import Transfers, to_device, to_host

# The compiled build answers empty(n, dtype, like="torch") in C (see _entry); the pure build has
# the function itself.
empty = compiled_entry(_python_empty)

__all__ = [
    "Allocation",
    "DeviceArray",
    "Scope",
    "ScopeEscapeError",
    "Transfers",
    "current_scope",
    "default_resource",
    "device_empty",
    "empty",
    "empty_cache",
    "scope",
    "set_default_resource",
    "to_device",
    "to_host",
    "zeros",
]
