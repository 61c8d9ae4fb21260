"""``scope()``: every array made in a block is freed when it ends — or the block says why not.

Python frees an array when its last reference goes; a scope adds two things on top:

1. a guarantee: on exit, every array made inside it is gone and its bytes are back in their
   resource (the scope runs the cyclic collector once if some are only held by cycles);
2. use-after-free protection: an array still referenced from outside when the block ends
   (returned, stored in a list, or simply still bound to a name) is *not* freed under that
   reference. Its bytes stay alive and go back when it finally dies, as usual, and the scope
   raises :class:`ScopeEscapeError` naming the escaped arrays, so the leak is found, not hidden.

Names bound inside a ``with`` block outlive it in Python, so write ``del a`` before the block ends
(or do the work in a function called inside it); keep a result with ``np.array(a)`` (a copy).
When the block itself raised, the traceback still references its locals; the scope then never
raises over the original exception.

``scope(resource=...)`` also makes ``resource`` the one ``empty``/``zeros`` use inside the block
(unless they are given one). Scopes nest and are per thread and per asyncio task (contextvars);
an array belongs to the innermost scope active when it was made.
"""

from __future__ import annotations

import contextvars
import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tensorarena.errors import ScopeEscapeError
from tensorarena.interop.default import check_host_accessible
from tensorarena.memory.resource import MemoryResource

if TYPE_CHECKING:
    from tensorarena.interop.owner import Allocation

__all__ = ["Scope", "ScopeEscapeError", "current_scope", "scope"]


class Scope:
    """The arrays made inside one ``with scope():`` block (weakly referenced)."""

    __slots__ = ("_refs", "allocations", "resource")

    def __init__(self, resource: MemoryResource | None) -> None:
        self.resource = resource
        self._refs: list[weakref.ref[Allocation]] = []
        self.allocations = 0  #: arrays made in the scope so far

    def track(self, allocation: Allocation) -> None:
        """Record an allocation made inside the scope."""
        self._refs.append(weakref.ref(allocation))
        self.allocations += 1
        if len(self._refs) >= 1024 and self.allocations & 1023 == 0:
            # Long loops inside one scope: drop the references to arrays already dead.
            self._refs = [ref for ref in self._refs if ref() is not None]

    def live(self) -> list[Allocation]:
        """Allocations made in the scope whose arrays are still alive."""
        return [allocation for ref in self._refs if (allocation := ref()) is not None]

    def close(self, *, check: bool = True) -> None:
        """End the scope: collect cycles if needed; raise if arrays escaped and ``check``."""
        if not self.live():
            self._refs.clear()
            return
        gc.collect()  # arrays held only by reference cycles die here, freeing their bytes
        escaped = self.live()
        self._refs.clear()
        if not escaped or not check:
            return
        descriptions = [repr(allocation) for allocation in escaped]
        nbytes = sum(allocation.nbytes for allocation in escaped)
        # The traceback keeps this frame alive: drop our references before raising, or the
        # escaped memory could not be freed when the user drops theirs.
        del escaped
        raise ScopeEscapeError(descriptions, nbytes)

    def __repr__(self) -> str:
        return f"Scope(allocations={self.allocations}, live={len(self.live())})"


_current: contextvars.ContextVar[Scope | None] = contextvars.ContextVar(
    "tensorarena_scope", default=None
)


current_scope: Callable[[], Scope | None] = _current.get
"""``current_scope()``: the innermost active scope of this thread/task, or ``None``.

The context variable's own ``get`` (a C method): every ``empty()`` calls it, and a Python
function around it would cost a frame on that hot path."""


@contextmanager
def scope(resource: MemoryResource | None = None) -> Iterator[Scope]:
    """Free every array made inside the block when it ends; raise if one is still referenced.

    ``resource`` (optional) is the resource ``empty``/``zeros`` use inside the block.
    """
    if resource is not None:
        check_host_accessible(resource)
    else:
        outer = _current.get()
        resource = outer.resource if outer is not None else None
    current = Scope(resource)
    token = _current.set(current)
    failed = False
    try:
        yield current
    except BaseException:
        failed = True
        raise
    finally:
        _current.reset(token)
        current.close(check=not failed)
