"""How ``empty(..., like="torch")`` makes a tensor over a block, per dtype argument.

Two routes, both giving the block back exactly when the tensor's storage dies:

* **DLPack** (the compiled build, outside a :func:`~tensorarena.interop.scope`): the C
  extension's ``dlpack(resource, address, nbytes, shape, dtype)`` (``_native_dlpack.c``) makes a
  ``"dltensor"`` capsule of exactly the shape over the block, which takes the block over (no
  owner object: its deleter calls ``deallocate``), and ``torch._C._from_dlpack`` makes the
  tensor from it in C. Why: the public ``torch.frombuffer`` spends ~3 700 instructions, a third
  of a ``torch.empty``, parsing its keyword-only ``dtype``; the public ``torch.from_dlpack`` is a
  Python function that costs more than frombuffer; n-d shapes need no ``view``. Callgrind, a
  64 KiB tensor made and freed: 11 645 instructions through frombuffer and an owner, 8 484
  through DLPack (``torch.empty``: 9 161). Taken for the dtypes whose DLPack code torch reads
  back as the same torch dtype (probed once per dtype, over bytes of our own). The private
  ``_from_dlpack`` is looked up once; where a torch lacks it, the route is frombuffer.
* **frombuffer** (the pure build, scopes, which track an owner, and dtypes DLPack cannot carry,
  such as ``torch.uint16``): ``torch.frombuffer`` over the owner's buffer, ``view`` for n-d (or
  ``torch.from_numpy`` of the n-d array for a NumPy dtype).

The route is worked out once per dtype argument (:func:`torch_route`) and cached, and the last
one is found by the identity of the dtype argument (:data:`LAST_ROUTE`), so the hot path neither
looks torch up nor converts a dtype. ``empty``'s compiled entry (:mod:`tensorarena.interop._entry`)
reads the DLPack routes from :data:`ROUTES` and keeps the last one itself.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Final, final

import numpy as np

from tensorarena._optional import require

__all__ = ["LAST_ROUTE", "ROUTES", "DtypeEntry", "LastRoute", "TorchRoute", "torch_route"]

DtypeEntry = tuple[int, str, Any, Any, np.dtype[Any]]
"""What ``empty`` resolves a dtype argument to: (item size, typestr, structured dtype or
``None``, torch dtype or ``None``, the NumPy dtype the bytes are read as)."""

#: DLPack dtype codes (dlpack.h ``DLDataTypeCode``).
_INT: Final = 0
_UINT: Final = 1
_FLOAT: Final = 2
_BFLOAT: Final = 4
_COMPLEX: Final = 5
_BOOL: Final = 6

#: torch dtype name -> DLPack code; the bits are the item size. Unsigned ints wider than a byte
#: are left out: torch reads them only in recent versions, and frombuffer carries them anyway.
_CODES: Final[dict[str, int]] = {
    "bool": _BOOL,
    "uint8": _UINT,
    "int8": _INT,
    "int16": _INT,
    "int32": _INT,
    "int64": _INT,
    "float16": _FLOAT,
    "float32": _FLOAT,
    "float64": _FLOAT,
    "bfloat16": _BFLOAT,
    "complex64": _COMPLEX,
    "complex128": _COMPLEX,
}


@final
class TorchRoute:
    """The tensor route of one dtype argument (``key``, resolved to ``entry``): ``dlpack_dtype``
    is DLPack's ``code | bits << 8`` for the C extension, ``None`` where the route is
    ``torch.frombuffer`` with ``dtype``; ``dtype`` is ``None`` where torch has no such dtype
    (``torch.from_numpy`` then raises the clear error)."""

    __slots__ = ("dlpack_dtype", "dtype", "entry", "from_dlpack", "key", "torch")
    key: Any
    entry: DtypeEntry
    torch: Any
    dtype: Any
    # Any: boxed once here, passed as it is at every call.
    dlpack_dtype: Any
    from_dlpack: Any

    def __init__(
        self,
        key: Any,
        entry: DtypeEntry,
        torch: Any,
        dtype: Any,
        dlpack_dtype: int | None,
        from_dlpack: Any,
    ) -> None:
        self.key = key
        self.entry = entry
        self.torch = torch
        self.dtype = dtype
        self.dlpack_dtype = dlpack_dtype
        self.from_dlpack = from_dlpack


@final
class LastRoute:
    """The route of the last tensor made: found by the identity of its dtype argument (an
    attribute read and a compare instead of two dictionary lookups)."""

    __slots__ = ("route",)
    route: TorchRoute | None

    def __init__(self) -> None:
        self.route = None


LAST_ROUTE: Final = LastRoute()


ROUTES: Final[dict[Any, TorchRoute]] = {}
"""Dtype argument -> its route (:func:`torch_route` fills it; ``empty`` reads it first)."""
_PROBED: Final[dict[Any, bool]] = {}  # torch dtype -> DLPack carries it


class _Unowned:
    """The resource of the probe's owner: its bytes are a NumPy array's, nothing to give back."""

    def deallocate(self, address: int, nbytes: int) -> None:
        pass


_PROBE_BYTES: Final = np.zeros(16, np.uint8)


def torch_route(dtype: Any, entry: DtypeEntry) -> TorchRoute:
    """The route of ``dtype``, resolved to ``entry`` (cached; imports torch, or raises the error
    naming the extra)."""
    with contextlib.suppress(KeyError, TypeError):
        return ROUTES[dtype]
    itemsize, _, _, torch_dtype, np_dtype = entry
    torch = sys.modules.get("torch") or require(
        "torch", extra="torch", feature="tensorarena.empty(like='torch')"
    )
    if torch_dtype is None:
        torch_dtype = _numpy_to_torch(torch, np_dtype)
    from_dlpack = getattr(getattr(torch, "_C", None), "_from_dlpack", None)
    dlpack_dtype = None
    if torch_dtype is not None and from_dlpack is not None:
        code = _CODES.get(str(torch_dtype).removeprefix("torch."))
        if code is not None and _dlpack_carries(from_dlpack, torch_dtype, code | itemsize << 11):
            dlpack_dtype = code | itemsize << 11
    route = TorchRoute(dtype, entry, torch, torch_dtype, dlpack_dtype, from_dlpack)
    with contextlib.suppress(TypeError):  # unhashable: worked out again next time
        if len(ROUTES) < 256:
            ROUTES[dtype] = route
    return route


def _numpy_to_torch(torch: Any, np_dtype: np.dtype[Any]) -> Any:
    """The torch dtype of ``np_dtype``, or ``None`` where torch has none."""
    try:
        return torch.from_numpy(np.empty(0, np_dtype)).dtype
    except (TypeError, ValueError):
        return None


def _dlpack_carries(from_dlpack: Any, torch_dtype: Any, dlpack_dtype: int) -> bool:
    """Whether torch reads our capsule of ``dlpack_dtype`` back as ``torch_dtype`` (probed once
    per torch dtype, over a NumPy array's bytes)."""
    known = _PROBED.get(torch_dtype)
    if known is not None:
        return known
    from tensorarena.interop.owner import native_dlpack

    carries = False
    if native_dlpack is not None:
        address, nbytes = _PROBE_BYTES.ctypes.data, _PROBE_BYTES.nbytes
        try:
            capsule = native_dlpack(_Unowned(), address, nbytes, 1, dlpack_dtype)
            carries = from_dlpack(capsule).dtype == torch_dtype
        except Exception:  # torch refuses the code: the frombuffer route
            carries = False
    _PROBED[torch_dtype] = carries
    return carries
