"""``empty`` and ``zeros``: NumPy arrays and PyTorch tensors whose bytes come from a resource.

The bytes are taken with one ``resource.allocate`` and owned by an
:class:`~tensorarena.interop.owner.Allocation`, the ``.base`` of the array: they go back with one
``resource.deallocate`` when the array and every view of it are gone — never earlier. The owner
exports the buffer protocol over exactly the block (see :mod:`tensorarena.interop.owner`): in the
compiled build the native (C) owner, for every size; in the pure build a ctypes array of a cached
type per byte count. The array is built over it in C by ``np.frombuffer`` (1-d) or
``np.ndarray(buffer=)``. A torch tensor (``like="torch"``) is made, in the compiled build, from
a DLPack capsule that takes the block over (no owner object: the block goes back when the
tensor's storage dies; see :mod:`tensorarena.interop._torch_route`); in the pure build, inside a
:func:`scope` (which tracks owners) and for dtypes DLPack cannot carry, by ``torch.frombuffer``
over the owner (1-d) or ``torch.from_numpy`` of the n-d array. The pure build's sizes without a
cached owner type, zero-size tensors (``torch.frombuffer`` refuses them) and structured dtypes
as tensors take the ``__array_interface__`` owner (a tensor is then ``torch.from_numpy`` over
that array).

Which resource: the ``resource=`` argument, else that of the innermost :func:`scope` given one,
else :func:`~tensorarena.interop.default.default_resource` (a thread-cached pool over mmap).
Arrays are built only over memory the CPU may touch (``resource.memory_kind``): the scope's and
the default resource are checked when they are set, an explicit ``resource=`` on its first use
(the last one found good is remembered through a weak reference, so a loop over one pool pays
the check once).

This is the hot path of pooled arrays, so it avoids work: dtypes are resolved once and cached,
and the compiled build compiles this module with mypyc (``_version.COMPILED_MODULES``) and puts a
C entry in front of ``empty`` (the public ``tensorarena.empty``, see
:mod:`tensorarena.interop._entry`) that makes the repeated ``empty(n, dtype, like="torch")``
itself and hands every other call to this function. The
arguments are annotated ``... | Any`` where callers pass more than the annotation says (NumPy
integers, shapes of any sequence type): compiled code checks declared types at the call, and such
input must reach the checks below, which accept it or raise the specific error.
On the interface route a structured dtype is built as raw ``V<itemsize>`` records and viewed as
itself, so padding and offsets survive (``__array_interface__``'s ``descr`` cannot express them).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import weakref
from typing import Any, Final, Literal

import numpy as np

from tensorarena.errors import InvalidArgumentError, InvalidDtypeError, InvalidSizeError
from tensorarena.interop import default as _defaults
from tensorarena.interop._torch_route import LAST_ROUTE as _last_route
from tensorarena.interop._torch_route import ROUTES as _ROUTES
from tensorarena.interop._torch_route import DtypeEntry as _DtypeEntry
from tensorarena.interop._torch_route import TorchRoute, torch_route
from tensorarena.interop.default import check_host_accessible, default_resource
from tensorarena.interop.owner import (
    BLOCK_TYPES,
    Allocation,
    InterfaceAllocation,
    block_type,
    native_dlpack,
    native_owner,
)
from tensorarena.interop.scope import Scope, current_scope
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, MemoryResource
from tensorarena.sizes import MAX_SIZE, check_alignment

__all__ = ["DTYPES", "empty", "zeros"]

Shape = int | tuple[int, ...] | list[int]
# Bound once: the hot path calls them for every array. ``Final``: the compiled build keeps them
# in C variables instead of looking them up in the module's namespace at every call.
_asarray: Final = np.asarray
_frombuffer: Final = np.frombuffer
_ndarray: Final = np.ndarray
_block_types_get: Final = BLOCK_TYPES.get
_native_owner: Final = native_owner  # None in the pure build
_dlpack: Final[Any] = native_dlpack  # None in the pure build (no route has a DLPack dtype there)
_current_scope: Final = current_scope
_default_resource: Final = default_resource
_defaults_namespace: Final[dict[str, Any]] = vars(_defaults)
_MAX_SIZE: Final = MAX_SIZE
_DEFAULT_ALIGNMENT: Final = DEFAULT_ALIGNMENT
# The default's int object: the default argument is this object, found by identity (a compare of
# an Any with an int is a rich comparison, ~100 instructions).
_DEFAULT_ALIGNMENT_OBJECT: Final[Any] = DEFAULT_ALIGNMENT
Like = Literal["numpy", "torch"]

#: What each dtype argument seen so far resolves to (filled by :func:`empty`; the native entry
#: reads it too).
DTYPES: Final[dict[Any, _DtypeEntry]] = {}
# Dimensions must fit NumPy's npy_intp.
_MAX_DIM: Final = (1 << 63) - 1
# The largest int the compiled build keeps unboxed: a bound compared at C speed.
_MAX_SHORT_DIM: Final = (1 << 62) - 1
_NUMPY: Final = "numpy"
_TORCH: Final = "torch"  # a literal "torch" in the caller's code is the same (interned) object

# The last explicit resource found host-accessible (see the module docstring).
_verified: weakref.ref[Any] | None = None


def _resolve_dtype(dtype: Any) -> _DtypeEntry:
    try:
        return DTYPES[dtype]
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
    entry = (resolved.itemsize, typestr, structured, torch_dtype, resolved)
    # Unhashable specs are resolved again next time; the cap keeps odd callers from growing it.
    with contextlib.suppress(TypeError):
        if len(DTYPES) < 256:
            DTYPES[dtype] = entry
    return entry


def _normalize_shape(shape: Shape | Any) -> tuple[int, ...]:
    if type(shape) is int or isinstance(shape, np.integer):  # NumPy takes np.int64(5) too
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
    shape: Shape | Any,
    dtype: Any = np.float32,
    *,
    resource: MemoryResource | None = None,
    like: Like | Any = "numpy",
    alignment: int | Any = DEFAULT_ALIGNMENT,
) -> Any:
    """A C-contiguous array of ``shape`` and ``dtype`` over fresh bytes from ``resource``.

    ``like="numpy"`` returns an ``np.ndarray``; ``like="torch"`` a CPU ``torch.Tensor`` over the
    same bytes (``dtype`` may then be a torch dtype, ``torch.bfloat16`` included). The contents
    are undefined. The bytes return to the resource when the array and all its views are gone.
    A tensor's storage is not resizable (as ``torch.from_numpy``'s): never grow it with
    ``resize_``, which in torch 2.13 raises but keeps the new shape, and the next read of that
    tensor then crashes the process (a torch bug; so does ``torch.from_numpy(a).resize_(n)``).
    Raises :class:`InvalidSizeError` for a bad shape, :class:`InvalidAlignmentError` for a bad
    alignment, :class:`InvalidDtypeError` for a dtype raw memory cannot hold,
    :class:`InvalidArgumentError` for ``like``, :class:`NotHostAccessibleError` for a resource
    whose memory the CPU cannot touch.
    """
    # A tensor of the same dtype object as the last one: its route holds the dtype's entry.
    route: TorchRoute | None = _last_route.route
    if route is not None and route.key is dtype and like is _TORCH:
        entry = route.entry
    else:
        route = None
        try:
            entry = DTYPES[dtype]
        except (KeyError, TypeError):
            entry = _resolve_dtype(dtype)
    itemsize, _, structured, torch_dtype, np_dtype = entry
    # An int shape within the compiled build's unboxed ints (< 2**62): one dimension, no tuple
    # (``dims`` is None); the 1-d NumPy array needs none, the other paths make it.
    dims: tuple[int, ...] | None = None
    if type(shape) is int and 0 <= shape <= _MAX_SHORT_DIM:
        count = shape
    else:
        dims = _normalize_shape(shape)
        count = math.prod(dims)
        if count == 0 and math.prod([dim for dim in dims if dim]) * itemsize > _MAX_SIZE:
            # Zero items, but NumPy (and torch) refuse the other dimensions' product all the same.
            raise InvalidSizeError(
                f"shape {shape!r} of {itemsize}-byte items: its nonzero dimensions need over "
                f"{_MAX_SIZE} bytes"
            )
    nbytes = count * itemsize
    if nbytes > _MAX_SIZE:
        raise InvalidSizeError(
            f"shape {shape!r} of {itemsize}-byte items needs {nbytes} bytes, over {_MAX_SIZE}"
        )
    # The default, and literals, are the same objects: found by identity, no compare.
    if like is _TORCH or (like is not _NUMPY and like != "numpy"):
        if like is not _TORCH and like != "torch":
            raise InvalidArgumentError(f"like must be 'numpy' or 'torch', not {like!r}")
        if route is None:
            try:
                route = _ROUTES[dtype]
            except (KeyError, TypeError):
                route = torch_route(dtype, entry)
            _last_route.route = route
    elif torch_dtype is not None:
        raise InvalidDtypeError(f"a torch dtype ({dtype}) needs like='torch'")
    if alignment is not _DEFAULT_ALIGNMENT_OBJECT and alignment != _DEFAULT_ALIGNMENT:
        alignment = check_alignment(alignment)
    current = _current_scope()
    if resource is not None:
        verified = _verified  # the check's fast path inline: a call costs ~50 ns
        if verified is None or verified() is not resource:
            _check_explicit(resource)
    elif current is not None and current.resource is not None:
        resource = current.resource  # checked when the scope began
    else:
        # Checked when it was set. Read from its module's namespace: the function around it
        # would cost a Python call per array (it only creates the resource on first use), and
        # a dict read costs less than the module attribute.
        resource = _defaults_namespace["_default"]
        if resource is None:
            resource = _default_resource()
    # A zero-size array still gets a (1-byte) block: it has an address and an owner like any.
    # Boxed once (Any): the int object is passed to allocate and kept by the owner.
    request: Any = nbytes or 1
    if route is not None and (nbytes == 0 or structured is not None):
        # torch.frombuffer refuses zero items; a structured dtype has no torch dtype (from_numpy
        # says so). Both go through NumPy.
        address = resource.allocate(request, alignment)
        shape_ = (count,) if dims is None else dims
        return _through_interface(resource, address, request, shape_, entry, route, current)
    if route is not None and route.dlpack_dtype is not None and current is None:
        # DLPack (see _torch_route): the capsule takes the block over, no owner, no parser.
        # ``shape`` itself where it is the one dimension: an int object already.
        address = resource.allocate(request, alignment)
        try:
            capsule = _dlpack(
                resource, address, request, shape if dims is None else dims, route.dlpack_dtype
            )
        except BaseException:
            resource.deallocate(address, request)
            raise
        return route.from_dlpack(capsule)  # if this raises, the dying capsule frees the block
    if _native_owner is not None:
        address = resource.allocate(request, alignment)
        try:
            owner: Any = _native_owner(resource, address, request)  # a buffer, to NumPy
        except BaseException:  # a bad address from the resource, or no memory for the owner
            resource.deallocate(address, request)
            raise
    else:  # the pure build: the ctypes owner of a cached type, else the interface
        # The owner type first: making one may fail, and nothing must be allocated then.
        owner_type = _block_types_get(request) or block_type(request)
        address = resource.allocate(request, alignment)
        if owner_type is None:
            shape_ = (count,) if dims is None else dims
            return _through_interface(resource, address, request, shape_, entry, route, current)
        owner = _ctypes_owner(owner_type, resource, address, request)
    # From here the owner is responsible: if anything below raises, it frees the block as it dies.
    # The owner's buffer is exactly the block, so frombuffer needs no count; but a zero-size
    # array's block is 1 byte, which is no whole number of wider items (ndarray takes a prefix).
    if current is not None:
        current.track(owner)
    one_d = dims is None or len(dims) == 1
    if route is None and one_d and nbytes != 0:
        return _frombuffer(owner, np_dtype)
    if dims is None:
        dims = (count,)
    if route is None:
        return _ndarray(dims, np_dtype, owner)
    torch = route.torch
    # A NumPy dtype, n-d: from_numpy of the n-d array (~1.5 µs) beats frombuffer and view(dims)
    # (~3 µs). No torch equivalent (route.dtype is None): from_numpy raises the clear error.
    if torch_dtype is None and (not one_d or route.dtype is None):
        return torch.from_numpy(_ndarray(dims, np_dtype, owner))
    tensor = torch.frombuffer(owner, dtype=route.dtype)
    return tensor if one_d else tensor.view(dims)


def _ctypes_owner(owner_type: Any, resource: MemoryResource, address: int, request: int) -> Any:
    """A ctypes block owner of ``request`` bytes at ``address`` (the block is freed if that
    fails)."""
    try:
        owner = owner_type.from_address(address)
        owner.resource = resource
        owner.address = address
    except BaseException:
        resource.deallocate(address, request)
        raise
    return owner


def _through_interface(
    resource: MemoryResource,
    address: int,
    request: int,
    dims: tuple[int, ...],
    entry: _DtypeEntry,
    route: TorchRoute | None,
    current: Scope | None,
) -> Any:
    """The array (or tensor) over ``address`` through an :class:`InterfaceAllocation` owner."""
    _, typestr, structured, torch_dtype, _ = entry
    interface = {"data": (address, False), "shape": dims, "typestr": typestr, "version": 3}
    owner = InterfaceAllocation(resource, address, request, interface)
    array: Any = _asarray(owner)
    if structured is not None:
        array = array.view(structured)
    if current is not None:
        current.track(owner)
    if route is not None:
        tensor = route.torch.from_numpy(array)
        return tensor if torch_dtype is None else tensor.view(torch_dtype)
    return array


def zeros(
    shape: Shape | Any,
    dtype: Any = np.float32,
    *,
    resource: MemoryResource | None = None,
    like: Like | Any = "numpy",
    alignment: int | Any = DEFAULT_ALIGNMENT,
) -> Any:
    """Like :func:`empty`, with every byte zero (``fill(0)`` would write ``b"0"`` into a string
    dtype, so the bytes are cleared directly)."""
    array = empty(shape, dtype, resource=resource, like=like, alignment=alignment)
    if like == "torch":
        array.zero_()
    else:
        owner = array.base
        if not isinstance(owner, Allocation):  # a structured dtype: a view of the raw records
            owner = owner.base
        ctypes.memset(owner.address, 0, owner.nbytes)
    return array
