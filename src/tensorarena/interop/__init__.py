"""Arrays on top of resources: NumPy arrays and PyTorch tensors whose bytes come from a resource.

``empty``/``zeros`` take the bytes from a resource (the default: a thread-safe pool over mmap) and
give them back when the array and all its views are garbage-collected; ``scope()`` bounds the
lifetime of every array made inside a block. PyTorch is imported only for ``like="torch"``.
"""

from tensorarena.interop.arrays import empty, zeros
from tensorarena.interop.default import default_resource, set_default_resource
from tensorarena.interop.owner import Allocation
from tensorarena.interop.scope import Scope, ScopeEscapeError, current_scope, scope

__all__ = [
    "Allocation",
    "Scope",
    "ScopeEscapeError",
    "current_scope",
    "default_resource",
    "empty",
    "scope",
    "set_default_resource",
    "zeros",
]
