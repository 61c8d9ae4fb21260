"""Arenas that a call's outputs keep: one block per call, taken again once its outputs are gone.

With ``outputs="arena"`` (:class:`~tensorarena.runtime.PlannedProgram`) a graph's outputs are
planned like its other buffers and handed to the caller as views of the arena: torch allocates
nothing for them, and their bytes are those of activations that died earlier in the call (the
plan reuses them; a training step's gradients take the bytes of the activations their backward
freed). The block then belongs to the caller until every view of it is gone, so each call
takes a block that no caller's tensor holds, making one (with its code) when all are held. A
loop that keeps one step's outputs while running the next alternates between two blocks.

Whether a block is held is read from its storage's use count (how many tensors share the
storage) plus the Python references to its storage object: torch keeps one ``UntypedStorage``
object per storage, which holds one use however many names refer to it, so a caller keeping
only ``output.untyped_storage()`` shows in the second number alone. The count of this runtime's
own references to a block (the block and the slots of the code generated over it) is taken once,
when both are made and before any output exists, and nothing else is generated over these blocks
afterwards, so it never changes: a larger count is a reference of the caller's (an output, a view
or slice of one, its numpy array, its storage).
Outputs are handed over as new views (``aten.alias``), never the slot tensors themselves, so
that each one counts. A block is never taken while the count says held: live memory is never
aliased. Idle blocks beyond the one a call takes go back to their resource at that call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorarena._optional import load_torch
from tensorarena.interop.empty_cache import trim_pools
from tensorarena.runtime.device import CPU
from tensorarena.runtime.materialize import block

if TYPE_CHECKING:
    import torch

    from tensorarena.memory.resource import MemoryResource
    from tensorarena.runtime.generated_code import Generated

__all__ = ["HeldArenas", "storage_uses"]


def storage_uses(memory: torch.Tensor) -> int:
    """How many references the storage under ``memory`` has now: its use count (tensors, and the
    storage object) plus the Python references to its storage object (module docstring)."""
    torch = load_torch()
    storage = memory.untyped_storage()
    return int(torch._C._storage_Use_Count(storage._cdata)) + sys.getrefcount(storage)


@dataclass
class _Arena:
    memory: torch.Tensor
    code: Generated | None  # None: made when a call takes the block (:meth:`HeldArenas.take`)
    own_uses: int  # the storage's use count with no caller's tensor over it


def _release(arena: _Arena) -> None:
    """Drop the code's references to the block now: the generated function is in its own
    globals (a cycle only the garbage collector would break), and they hold the slots."""
    if arena.code is not None:
        arena.code.release()


def _with_code(arena: _Arena, make_code: Callable[[torch.Tensor], Generated]) -> Generated:
    """``arena``'s code, made now if it has none; its own use count moves by the new code's
    references (no caller's tensor holds the block: it was just taken)."""
    if arena.code is None:
        before = storage_uses(arena.memory)
        arena.code = make_code(arena.memory)
        arena.own_uses += storage_uses(arena.memory) - before
    return arena.code


class HeldArenas:
    """The blocks of one planned shape whose outputs live in the arena (module docstring).

    ``make_code(memory)`` generates the shape's code over a block; blocks are ``nbytes`` bytes
    from ``resource`` on ``device``."""

    def __init__(self, make_code: Callable[[torch.Tensor], Generated], nbytes: int,
                 resource: MemoryResource | None, device: str) -> None:
        self._make_code = make_code
        self._nbytes = nbytes
        self._resource = resource
        self._device = device
        self._arenas: list[_Arena] = []
        self.made = 0  #: blocks made so far (one more each time every block was held)

    @property
    def make_code(self) -> Callable[[torch.Tensor], Generated]:
        """What generates the shape's code over a block (``remake`` replaces it)."""
        return self._make_code

    def take(self) -> tuple[torch.Tensor, Generated]:
        """A block no caller's tensor holds and the code over it; idle blocks beyond it are
        released (their bytes go back to the resource)."""
        taken = self._take()
        return taken.memory, _with_code(taken, self._make_code)

    def take_block(self) -> torch.Tensor:
        """A block no caller's tensor holds, as :meth:`take`, for a call that runs code of
        its own over it (a shape's recording call, :mod:`~tensorarena.runtime.kernel_recording`):
        a block made now gets no code (made when a later call takes it), so that none is
        compiled that never runs."""
        return self._take(code=False).memory

    def _take(self, *, code: bool = True) -> _Arena:
        taken: _Arena | None = None
        held: list[_Arena] = []
        idle: list[_Arena] = []
        for arena in self._arenas:
            if storage_uses(arena.memory) > arena.own_uses:
                held.append(arena)
            elif taken is None:
                taken = arena
            else:
                idle.append(arena)
        if taken is None:
            taken = self._new(code=code)
        self._arenas = [taken, *held]
        if idle:
            for arena in idle:
                _release(arena)
            del arena, idle
            if self._device == CPU:
                # A block this size has an arena of its own in the default pool: give it
                # back rather than keep it resident (a training step whose caller kept one
                # step's gradients through the next held two arenas from then on).
                trim_pools(self._resource)
        return taken

    def _new(self, *, code: bool = True) -> _Arena:
        memory = block(self._nbytes, self._resource, device=self._device)
        arena = _Arena(memory, None, storage_uses(memory))
        del memory
        self.made += 1
        if code:
            _with_code(arena, self._make_code)
        return arena

    def remake(self, make_code: Callable[[torch.Tensor], Generated], nbytes: int) -> bool:
        """Generate every block's code anew with ``make_code`` (the same buffers at new offsets:
        kernels' allocations planned, :mod:`~tensorarena.runtime.kernel_arena`), if blocks of
        ``nbytes`` fit in them; return whether they did (else nothing changes). Each block's
        own use count moves by the difference between the new code's references and the old's
        (the caller's, held or not, do not change meanwhile)."""
        if nbytes > self._nbytes:
            return False
        for arena in self._arenas:
            if arena.code is None:  # made when a call takes it, with the new make_code
                continue
            before = storage_uses(arena.memory)
            _release(arena)
            arena.code = make_code(arena.memory)
            arena.own_uses += storage_uses(arena.memory) - before
        self._make_code = make_code
        return True

    def release(self) -> None:
        """Drop every block's code and this object's references to the blocks: those no caller
        holds go back to their resource now (not when the garbage collector breaks the code's
        cycles), those the caller holds when its tensors go. Nothing is taken afterwards."""
        for arena in self._arenas:
            _release(arena)
        self._arenas = []

    def idle_blocks(self) -> list[torch.Tensor]:
        """The blocks no caller's tensor holds now (their pages may go back between calls:
        :meth:`~tensorarena.runtime.workspace.Workspace.keep_idle`)."""
        return [a.memory for a in self._arenas if storage_uses(a.memory) <= a.own_uses]

    @property
    def held(self) -> int:
        """Blocks that tensors of the caller's hold now."""
        return sum(storage_uses(a.memory) > a.own_uses for a in self._arenas)

    @property
    def blocks(self) -> int:
        """Blocks kept now (held ones and the one the last call took)."""
        return len(self._arenas)

    def hand_over(self, outputs: Any, memory: torch.Tensor) -> Any:
        """``outputs`` (a pytree) with every tensor over ``memory`` replaced by a new view of
        it, so that the caller's tensors count as holding the block."""
        th = load_torch()
        from torch.utils import _pytree as pytree

        address = memory.untyped_storage().data_ptr()
        alias = th.ops.aten.alias.default

        def view(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.untyped_storage().data_ptr() == address:
                return alias(tensor)  # type: ignore[no-any-return]
            return tensor

        return pytree.tree_map_only(th.Tensor, view, outputs)

    def __repr__(self) -> str:
        return f"HeldArenas(nbytes={self._nbytes}, blocks={self.blocks}, made={self.made})"
