"""The memory-resource protocol, RMM-style: everything that hands out bytes speaks it.

Upstream resources (mmap'd host memory, pinned memory, device memory, address space alone) and
everything built on them (pools, adaptors) share two calls and one attribute, so they nest:

    allocate(nbytes, alignment=256, stream=None) -> int address
    deallocate(address, nbytes, stream=None) -> None
    memory_kind: MemoryKind      what the addresses are (host, device, managed, numbers only)

Addresses are exact ints. ``stream`` is an opaque token for stream-ordered resources (the GPU
layer); host resources accept and ignore ``None``. A resource raises the errors of
:mod:`tensorarena.errors` and leaves its state unchanged when it does. Ownership (RMM's rule): a
block handed out keeps its memory valid while it is live; nothing a user calls on the resource
unmaps or re-hands-out a live block's bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from tensorarena.errors import InvalidResourceError
from tensorarena.memory_kind import MemoryKind

__all__ = [
    "DEFAULT_ALIGNMENT",
    "MemoryKind",
    "MemoryResource",
    "ResourceAdaptor",
    "Stream",
    "check_resource",
    "resource_stack",
]

DEFAULT_ALIGNMENT = 256

Stream = Any
"""An opaque stream handle; ``None`` means the default (synchronous) stream."""


@runtime_checkable
class MemoryResource(Protocol):
    """Anything that allocates and deallocates bytes at integer addresses."""

    @property
    def memory_kind(self) -> MemoryKind:
        """What the addresses are: host memory, device memory, managed, or numbers only."""
        ...

    def allocate(
        self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, stream: Stream = None
    ) -> int:
        """Return the address of ``nbytes`` bytes aligned to ``alignment``."""
        ...

    def deallocate(self, address: int, nbytes: int, stream: Stream = None) -> None:
        """Give back the block at ``address`` that was allocated with ``nbytes``."""
        ...


def check_resource(resource: object, *, name: str = "upstream") -> MemoryResource:
    """Return ``resource`` if it is a resource instance, else raise InvalidResourceError.

    Catches the usual slips with a message that says what to do: a class instead of an
    instance (``Pool(HostMemory)``), or an object without ``allocate``/``deallocate``.
    """
    if isinstance(resource, type):
        raise InvalidResourceError(
            f"{name} must be a memory resource instance, got the class {resource.__name__}: "
            f"call it, e.g. {resource.__name__}()"
        )
    if not (
        callable(getattr(resource, "allocate", None))
        and callable(getattr(resource, "deallocate", None))
    ):
        raise InvalidResourceError(
            f"{name} must be a memory resource (allocate/deallocate), "
            f"not {type(resource).__name__}"
        )
    return resource  # type: ignore[return-value]


#: A stack of adaptors deeper than this is taken for a cycle of ``upstream`` references.
MAX_STACK_DEPTH = 64


def resource_stack(resource: object) -> Iterator[object]:
    """``resource``, its ``upstream``, that one's ``upstream``, ... (adaptors and pools expose
    it); stops at the first layer without one, or after :data:`MAX_STACK_DEPTH` layers."""
    for _ in range(MAX_STACK_DEPTH):
        if resource is None:
            return
        yield resource
        resource = getattr(resource, "upstream", None)


class ResourceAdaptor:
    """Base of the resources that wrap another (RMM's resource adaptors): the wrapped resource
    is ``upstream`` and its memory kind is theirs. A subclass sets ``self._upstream``
    (:func:`check_resource` first) and implements ``allocate``/``deallocate``."""

    _upstream: MemoryResource

    @property
    def upstream(self) -> MemoryResource:
        """The wrapped resource."""
        return self._upstream

    @property
    def memory_kind(self) -> MemoryKind:
        """The upstream's kind."""
        return self._upstream.memory_kind
