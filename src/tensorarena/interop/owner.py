"""The owner of an array's bytes: frees them back to their resource when the last view dies.

A NumPy array made over foreign memory keeps one object alive as its ``.base``; every view keeps
its parent alive in turn, so that object dies exactly when the last array or view over the bytes
does. :class:`Allocation` is that object. It exposes ``__array_interface__`` (so ``np.asarray``
builds the array directly over the address) and its ``__del__`` returns the block.

Why this mechanism — measured by ``tensorarena bench reuse --owners`` (µs to make and drop a
64 KiB float32 array plus one view; 2 shared cores, best batch of 7, expect ±20 %):

==========================================================  ==========
owner mechanism                                             µs
==========================================================  ==========
``__array_interface__`` owner with ``__del__`` (chosen)     1.26
ctypes ``c_char * n`` buffer + owner attribute + frombuffer 1.07
ctypes buffer + ``weakref.finalize``                        1.78
(``np.empty``, no foreign memory, for scale)                0.39
==========================================================  ==========

The ctypes route is a little faster in one dimension, but only while the byte count repeats:
``c_char * n`` builds a new ctypes *type* for every byte count not seen recently (13.7 µs each,
measured the same way), which dynamic shapes hit all the time; an n-d shape also costs it a
``reshape``, and it hands users a ctypes object as ``.base``. ``weakref.finalize`` registers
every array in a global registry. The interface owner costs the same for every shape and keeps
no global state, so it is the one used.
"""

from __future__ import annotations

from typing import Any

from tensorarena.memory.resource import MemoryResource

__all__ = ["Allocation"]


class Allocation:
    """``nbytes`` bytes at ``address`` from ``resource``; deallocated when this object dies."""

    __slots__ = ("__array_interface__", "__weakref__", "address", "nbytes", "resource")

    def __init__(
        self, resource: MemoryResource, address: int, nbytes: int, interface: dict[str, Any]
    ) -> None:
        # The caller builds the interface dict (data, shape, typestr, version[, descr]): one
        # argument instead of four keeps this constructor, on every array's path, short.
        self.resource = resource
        self.address = address
        self.nbytes = nbytes
        self.__array_interface__ = interface

    def __del__(self) -> None:
        # Runs when the last array/view over the bytes is gone (refcount zero, or the cyclic
        # collector). A failing deallocate here can only be reported, not raised: Python prints
        # it as an "Exception ignored in" message.
        self.resource.deallocate(self.address, self.nbytes)

    def __repr__(self) -> str:
        interface = self.__array_interface__
        return (
            f"Allocation(address={self.address:#x}, nbytes={self.nbytes}, "
            f"shape={interface['shape']}, typestr={interface['typestr']!r})"
        )
