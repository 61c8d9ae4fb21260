"""``empty`` and ``zeros``: NumPy arrays and PyTorch tensors whose bytes come from a resource.

The bytes are taken with one ``resource.allocate`` and owned by an
:class:`~tensorarena.interop.owner.Allocation`, the ``.base`` of the array: they go back with one
``resource.deallocate`` when the array and every view of it are gone — never earlier. A torch
tensor (``like="torch"``) is ``torch.from_numpy`` over that array: zero-copy, same bytes, and it
keeps the array (hence the bytes) alive for as long as it lives.

Which resource: the ``resource=`` argument, else that of the innermost :func:`scope` given one,
else :func:`~tensorarena.interop.default.default_resource` (a thread-cached pool over mmap).
Arrays are built only over memory the CPU may touch (``resource.memory_kind``): the scope's and
the default resource are checked when they are set, an explicit ``resource=`` on its first use
(the last one found good is remembered through a weak reference, so a loop over one pool pays
the check once).

This is the hot path of pooled arrays, so it avoids work: dtypes are resolved once and cached.
A structured dtype is built as raw ``V<itemsize>`` records and viewed as itself, so padding and
offsets survive (``__array_interface__``'s ``descr`` cannot express them).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import weakref
from typing import Any, Literal

import numpy as np

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError, InvalidDtypeError, InvalidSizeError
from tensorarena.interop.default import check_host_accessible, default_resource
from tensorarena.interop.owner import Allocation
from tensorarena.interop.scope import current_scope
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource
from tensorarena.sizes import MAX_SIZE, check_alignment

__all__ = ["empty", "zeros"]

Shape = int | tuple[int, ...] | list[int]
_asarray = np.asarray  # bound once: this module's hot path calls it for every array
Like = Literal["numpy", "torch"]

# dtype argument -> (item size, typestr, structured dtype or None, torch dtype or None).
_DtypeEntry = tuple[int, str, Any, Any]
_DTYPES: dict[Any, _DtypeEntry] = {}
# Dimensions must fit NumPy's npy_intp.
_MAX_DIM = (1 << 63) - 1

# The last explicit resource found host-accessible (see the module docstring).
_verified: weakref.ref[Any] | None = None


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
        try:
            resolved = np.dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidDtypeError(f"not a dtype: {dtype!r} ({exc})") from None
    if resolved.hasobject:
        raise InvalidDtypeError(
            f"dtype {resolved} holds Python objects: raw memory cannot hold them"
        )
    if resolved.itemsize == 0:
        raise InvalidDtypeError(f"dtype {resolved} has no size (flexible dtype without a length)")
    if resolved.subdtype is not None:
        raise InvalidDtypeError(
            f"sub-array dtype {resolved}: put the sub-array's shape in the shape"
        )
    structured = resolved if resolved.fields is not None else None
    typestr = resolved.str if structured is None else f"|V{resolved.itemsize}"
    entry = (resolved.itemsize, typestr, structured, torch_dtype)
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
        if dim > _MAX_DIM:
            raise InvalidSizeError(f"shape {shape!r}: a dimension exceeds {_MAX_DIM}")
    return dims if exact else tuple(int(dim) for dim in dims)


def _check_explicit(resource: Any) -> None:
    """Refuse a ``resource=`` whose memory the CPU cannot touch (once per resource in a row)."""
    global _verified
    verified = _verified
    if verified is not None and verified() is resource:
        return
    check_host_accessible(resource)
    with contextlib.suppress(TypeError):  # not weakly referenceable: checked every time
        _verified = weakref.ref(resource)


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
    alignment, :class:`InvalidDtypeError` for a dtype raw memory cannot hold,
    :class:`InvalidArgumentError` for ``like``, :class:`NotHostAccessibleError` for a resource
    whose memory the CPU cannot touch.
    """
    try:
        itemsize, typestr, structured, torch_dtype = _DTYPES[dtype]
    except (KeyError, TypeError):
        itemsize, typestr, structured, torch_dtype = _resolve_dtype(dtype)
    if type(shape) is int and 0 <= shape <= _MAX_DIM:
        dims: tuple[int, ...] = (shape,)
        nbytes = shape * itemsize
    else:
        dims = _normalize_shape(shape)
        nbytes = math.prod(dims) * itemsize
    if nbytes > MAX_SIZE:
        raise InvalidSizeError(
            f"shape {shape!r} of {itemsize}-byte items needs {nbytes} bytes, over {MAX_SIZE}"
        )
    torch = None
    if like != "numpy":
        if like != "torch":
            raise InvalidArgumentError(f"like must be 'numpy' or 'torch', not {like!r}")
        torch = require("torch", extra="torch", feature="tensorarena.empty(like='torch')")
    elif torch_dtype is not None:
        raise InvalidDtypeError(f"a torch dtype ({dtype}) needs like='torch'")
    if alignment != DEFAULT_ALIGNMENT:
        alignment = check_alignment(alignment)
    current = current_scope()
    if resource is not None:
        _check_explicit(resource)
    elif current is not None and current.resource is not None:
        resource = current.resource  # checked when the scope began
    else:
        resource = default_resource()  # checked when it was set
    # A zero-size array still gets a (1-byte) block: it has an address and an owner like any.
    request = nbytes or 1
    address = resource.allocate(request, alignment)
    # From here the owner is responsible: if anything below raises, its __del__ frees the block.
    interface = {"data": (address, False), "shape": dims, "typestr": typestr, "version": 3}
    owner = Allocation(resource, address, request, interface)
    array: Any = _asarray(owner)
    if structured is not None:
        array = array.view(structured)
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
        owner = array.base
        if type(owner) is not Allocation:  # a structured dtype: a view of the raw records
            owner = owner.base
        ctypes.memset(owner.address, 0, owner.nbytes)
    return array
