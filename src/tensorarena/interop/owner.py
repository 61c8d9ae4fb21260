"""The owner of an array's bytes: frees them back to their resource when the last view dies.

A NumPy array made over foreign memory keeps one object alive as its ``.base`` (NumPy collapses a
chain of views only down to the first base that is not an ndarray, which is the owner), a torch
tensor made with ``torch.frombuffer`` keeps its buffer object, and a memoryview keeps its
exporter: so the owner dies exactly when the last array, view, tensor or memoryview over the
bytes does, and returns the block to its resource, once. Every owner is an :class:`Allocation`
(``resource``, ``address``, ``nbytes``); there are three kinds:

* the **native owner** (:data:`NativeAllocation`, the compiled build's, for every size): a C
  type (``_native_owner.c``) that exports the buffer protocol over exactly the block and
  deallocates it in its finalizer, which both reference counting and the cyclic collector run
  once (a cycle through the resource is freed too); an exception from ``deallocate`` is reported
  as unraisable, like one from ``__del__``. Made by :data:`native_owner`, which checks its
  arguments;
* a **ctypes block owner** (the pure build's usual one): an instance of a ctypes
  ``c_ubyte * nbytes`` array type, made with ``from_address`` (no copy, ctypes never frees it),
  with the same buffer, and a ``__del__`` that deallocates;
* an **interface owner** (:class:`InterfaceAllocation`): exposes ``__array_interface__``, which
  ``np.asarray`` parses (a dict built and read per array, the slower route).

``np.frombuffer`` / ``np.ndarray(buffer=)`` and ``torch.frombuffer`` build arrays over a buffer
owner directly in C. Why C for the usual one: no Python-level class can export the buffer
protocol before Python 3.12 (PEP 688), nor can a mypyc class, and the ctypes route pays for a
type per byte count (microseconds and kilobytes to make one), so its types live in a bounded cache
(:data:`MAX_BLOCK_TYPES`) and a byte count gets one only the second time it is seen: a size met
once (dynamic shapes) takes the interface route, and once the cache is full new sizes keep it
(no eviction, so no churn). The ctypes types subclass ``ctypes.Array`` directly rather than
``c_ubyte * nbytes``, whose types ctypes keeps in a private cache of its own, forever. The pure
build (no C compiler, or ``TENSORARENA_PURE=1``) keeps those two routes.
What each route costs: ``tensorarena bench reuse --owners``, recorded in ``bench/RESULTS.md``.

The block owners fold the owner into the buffer object (one object, no instance dict);
``weakref.finalize`` registers every array in a global registry. ``.base`` of an array is the
owner; copying or pickling one is refused (:meth:`Allocation.__reduce__`), since a copy would
free the block twice.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any, Final, NoReturn

from tensorarena.memory.resource import MemoryResource

__all__ = [
    "MAX_BLOCK_TYPES",
    "Allocation",
    "InterfaceAllocation",
    "NativeAllocation",
    "block_type",
    "native_owner",
]

#: The most block-owner types kept (one per byte count; ~2 KB each).
MAX_BLOCK_TYPES: Final = 1024

class Allocation:
    """``nbytes`` bytes at ``address`` from ``resource``, deallocated when this owner dies.

    The base of both owner kinds; never made directly.
    """

    __slots__ = ()
    resource: MemoryResource
    address: int
    nbytes: int

    def __reduce__(self) -> NoReturn:
        # A copy would be a second owner of the same block: two deallocations.
        raise TypeError(f"{type(self).__name__} owns a memory block and cannot be copied")

    def __repr__(self) -> str:
        return f"Allocation(address={self.address:#x}, nbytes={self.nbytes})"


class InterfaceAllocation(Allocation):
    """An owner that exposes ``__array_interface__`` (``np.asarray`` builds the array)."""

    __slots__ = ("__array_interface__", "__weakref__", "address", "nbytes", "resource")

    def __init__(
        self, resource: MemoryResource, address: int, nbytes: int, interface: dict[str, Any]
    ) -> None:
        # The caller builds the interface dict (data, shape, typestr, version): one argument
        # instead of four keeps this constructor short.
        self.resource = resource
        self.address = address
        self.nbytes = nbytes
        self.__array_interface__ = interface

    def __del__(self) -> None:
        # Runs when the last array/view over the bytes is gone (refcount zero, or the cyclic
        # collector). A failing deallocate here can only be reported, not raised: Python prints
        # it as an "Exception ignored in" message.
        self.resource.deallocate(self.address, self.nbytes)


class _BlockOwner(Allocation):
    """The methods of every block-owner type (an array of ``nbytes`` ``c_ubyte`` made by
    :func:`block_type`, which adds the ``resource``, ``address`` and ``__weakref__`` slots
    (scopes track owners weakly) and the ``nbytes`` class attribute)."""

    __slots__ = ()

    def __del__(self) -> None:
        # As InterfaceAllocation.__del__. A ctypes object made with from_address never frees
        # its memory itself: this is the block's only way back. (``address`` is a slot, equal to
        # ctypes.addressof(self): reading a slot is cheaper than the call.)
        self.resource.deallocate(self.address, self.nbytes)


NewOwner = Callable[[Any, int, int], Allocation]


NewCapsule = Callable[[Any, int, int, Any, int], Any]


def _define_native() -> tuple[type[Allocation] | None, NewOwner | None, NewCapsule | None]:
    """The native owner type, its constructor and its DLPack export, or ``None`` each without
    the extension."""
    try:
        from tensorarena.interop import _native_dlpack, _native_owner
    except ImportError:  # the pure build
        return None, None, None
    return _native_owner.define_type(Allocation), _native_owner.owner, _native_dlpack.dlpack


NativeAllocation, native_owner, native_dlpack = _define_native()
"""The native owner type (a subclass of :class:`Allocation`), ``native_owner(resource, address,
nbytes)``, which makes one (``TypeError``/``ValueError`` for arguments that are not positive
ints), and ``native_dlpack(resource, address, nbytes, shape, dtype)``, a DLPack ``"dltensor"``
capsule of a C-contiguous CPU tensor over the block that takes the block over: it goes back with
one ``deallocate`` when the tensor (or the unconsumed capsule) dies (``ValueError`` for a shape
whose bytes exceed the block); all ``None`` where the C extension is not built."""

BLOCK_TYPES: Final[dict[int, Any]] = {}
"""Byte count -> block-owner type (``type.from_address(address)`` makes an owner)."""
_seen_once: set[int] = set()


def block_type(nbytes: int) -> Any:
    """The block-owner type for ``nbytes``-byte blocks, or ``None`` while the interface owner
    should be used (a size seen for the first time, or the cache is full)."""
    known = BLOCK_TYPES.get(nbytes)
    if known is not None:
        return known
    if len(BLOCK_TYPES) >= MAX_BLOCK_TYPES:
        return None
    if nbytes not in _seen_once:
        if len(_seen_once) >= 4 * MAX_BLOCK_TYPES:
            _seen_once.clear()  # bounded: one-off sizes must not accumulate
        _seen_once.add(nbytes)
        return None
    _seen_once.discard(nbytes)
    made = type(
        f"Block{nbytes}",
        (_BlockOwner, ctypes.Array),
        {
            "_type_": ctypes.c_ubyte,
            "_length_": nbytes,
            "__slots__": ("resource", "address", "__weakref__"),
            "nbytes": nbytes,
            "__module__": __name__,
        },
    )
    BLOCK_TYPES[nbytes] = made
    return made
