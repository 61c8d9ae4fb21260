"""``empty`` and ``zeros``: NumPy arrays and PyTorch tensors whose bytes come from a resource.

The bytes are taken with one ``resource.allocate`` and owned by an
:class:`~tensorarena.interop.owner.Allocation`, the ``.base`` of the array: they go back with one
``resource.deallocate`` when the array and every view of it are gone — never earlier. A torch
tensor (``like="torch"``) is ``torch.from_numpy`` over that array: zero-copy, same bytes, and it
keeps the array (hence the bytes) alive for as long as it lives.

Which resource: the ``resource=`` argument, else that of the innermost :func:`scope` given one,
else :func:`~tensorarena.interop.default.default_resource` (a thread-safe pool over mmap).

This is the hot path of pooled arrays, so it avoids work: dtypes are resolved once and cached,
and the default resource is read from a module global.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from typing import Any, Literal

import numpy as np

from tensorarena._optional import require
from tensorarena.errors import InvalidSizeError
from tensorarena.interop import default as _default
from tensorarena.interop.owner import Allocation
from tensorarena.interop.scope import _current
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource
from tensorarena.sizes import check_alignment

__all__ = ["empty", "zeros"]

Shape = int | tuple[int, ...] | list[int]
_asarray = np.asarray  # bound once: this module's hot path calls it for every array
Like = Literal["numpy", "torch"]

# dtype argument -> (item size, typestr, descr or None, torch dtype or None), resolved once.
_DtypeEntry = tuple[int, str, "list[Any] | None", Any]
_DTYPES: dict[Any, _DtypeEntry] = {}


def _resolve_dtype(dtype: Any) -> _DtypeEntry:
    try:
        return _DTYPES[dtype]
    except (KeyError, TypeError):
        pass
    torch_dtype = None
    if type(dtype).__module__ == "torch" and type(dtype).__name__ == "dtype":
        # A torch dtype (bfloat16 included): allocate unsigned ints of its item size and
        # reinterpret them in torch. Checked by name so that numpy callers never import torch.
        torch_dtype = dtype
        resolved = np.dtype(f"u{dtype.itemsize}")
    else:
        resolved = np.dtype(dtype)
    if resolved.hasobject:
        raise TypeError(f"dtype {resolved} holds Python objects: raw memory cannot hold them")
    if resolved.itemsize == 0:
        raise TypeError(f"dtype {resolved} has no size (flexible dtype without a length)")
    if resolved.subdtype is not None:
        raise TypeError(f"sub-array dtype {resolved}: put the sub-array's shape in the shape")
    descr = resolved.descr if resolved.fields is not None else None
    entry = (resolved.itemsize, resolved.str, descr, torch_dtype)
    # Unhashable specs are resolved again next time; the cap keeps odd callers from growing it.
    with contextlib.suppress(TypeError):
        if len(_DTYPES) < 256:
            _DTYPES[dtype] = entry
    return entry


def _normalize_shape(shape: Shape) -> tuple[int, ...]:
    if type(shape) is int:
        dims: tuple[Any, ...] = (shape,)
    elif type(shape) is tuple:
        dims = shape
    else:
        try:
            dims = tuple(shape)  # type: ignore[arg-type]
        except TypeError:
            raise InvalidSizeError(
                f"shape must be an int or a sequence of ints, not {type(shape).__name__}"
            ) from None
    exact = True
    for dim in dims:
        if type(dim) is not int:
            if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
                raise InvalidSizeError(f"shape {shape!r}: dimensions must be ints, got {dim!r}")
            exact = False
        if dim < 0:
            raise InvalidSizeError(f"shape {shape!r}: dimensions must be non-negative")
    return dims if exact else tuple(int(dim) for dim in dims)


def empty(
    shape: Shape,
    dtype: Any = np.float32,
    *,
    resource: MemoryResource | None = None,
    like: Like = "numpy",
    alignment: int = DEFAULT_ALIGNMENT,
) -> Any:
    """A C-contiguous array of ``shape`` and ``dtype`` over fresh bytes from ``resource``.

    ``like="numpy"`` returns an ``np.ndarray``; ``like="torch"`` a CPU ``torch.Tensor`` over the
    same bytes (``dtype`` may then be a torch dtype, ``torch.bfloat16`` included). The contents
    are undefined. The bytes return to the resource when the array and all its views are gone.
    Raises :class:`InvalidSizeError` for a bad shape, :class:`InvalidAlignmentError` for a bad
    alignment, ``TypeError`` for a dtype raw memory cannot hold, ``ValueError`` for ``like``.
    """
    try:
        itemsize, typestr, descr, torch_dtype = _DTYPES[dtype]
    except (KeyError, TypeError):
        itemsize, typestr, descr, torch_dtype = _resolve_dtype(dtype)
    if type(shape) is int and shape >= 0:
        dims: tuple[int, ...] = (shape,)
        nbytes = shape * itemsize
    else:
        dims = _normalize_shape(shape)
        nbytes = math.prod(dims) * itemsize
    torch = None
    if like != "numpy":
        if like != "torch":
            raise ValueError(f"like must be 'numpy' or 'torch', not {like!r}")
        torch = require("torch", extra="torch", feature="tensorarena.empty(like='torch')")
    elif torch_dtype is not None:
        raise TypeError(f"a torch dtype ({dtype}) needs like='torch'")
    if alignment != DEFAULT_ALIGNMENT:
        check_alignment(alignment)
    current = _current.get()
    if resource is None:
        if current is not None and current.resource is not None:
            resource = current.resource
        else:
            # Not `or`: a resource may define __len__ (live blocks) and be falsy when empty.
            resource = _default._default
            if resource is None:
                resource = _default.default_resource()
    # A zero-size array still gets a (1-byte) block: it has an address and an owner like any.
    request = nbytes or 1
    address = resource.allocate(request, alignment)
    # From here the owner is responsible: if anything below raises, its __del__ frees the block.
    interface = {"data": (address, False), "shape": dims, "typestr": typestr, "version": 3}
    if descr is not None:
        interface["descr"] = descr
    owner = Allocation(resource, address, request, interface)
    array: Any = _asarray(owner)
    if current is not None:
        current.track(owner)
    if torch is not None:
        tensor = torch.from_numpy(array)
        return tensor if torch_dtype is None else tensor.view(torch_dtype)
    return array


def zeros(
    shape: Shape,
    dtype: Any = np.float32,
    *,
    resource: MemoryResource | None = None,
    like: Like = "numpy",
    alignment: int = DEFAULT_ALIGNMENT,
) -> Any:
    """Like :func:`empty`, with every byte zero (``fill(0)`` would write ``b"0"`` into a string
    dtype, so the bytes are cleared directly)."""
    array = empty(shape, dtype, resource=resource, like=like, alignment=alignment)
    if like == "torch":
        array.zero_()
    else:
        owner: Allocation = array.base
        ctypes.memset(owner.address, 0, owner.nbytes)
    return array
