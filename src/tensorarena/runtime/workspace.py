"""The memory planned programs run in: one block, grown on demand, used by one call at a time.

A :class:`Workspace` owns a single ``torch.uint8`` block from a tensorarena resource, on one
device (host memory, or a GPU's: :mod:`~tensorarena.runtime.device`). Every planned
program given the same workspace lays its slots over that block: their intermediates all die
before a call returns (outputs never live there), so programs that never run at the same time can
share the bytes. The forward and backward graphs of ``torch.compile`` share one this way, and so
do the per-shape plans of one dynamic program.

Sharing bytes means two calls must not overlap. :meth:`Workspace.use` serialises them with a lock
(``concurrency="serialize"``, the default) or refuses the second with
:class:`~tensorarena.errors.ConcurrentUseError` (``"refuse"``); a call that re-enters the
workspace from inside a call (a planned program called by an op of another) is always refused, as
it would otherwise deadlock or overwrite the outer call's intermediates.

Growing replaces the block by a larger one and bumps :attr:`Workspace.generation`; programs
rebuild their slots when they see a new generation. The old block goes back to its resource when
the last slot over it is dropped.

Between calls nothing in the block is read before a call writes it again, so its pages, and those
of the blocks its programs keep for outputs that no caller holds now (:meth:`keep_idle`), can go
back to the system while the block keeps its addresses: :meth:`release_idle_pages`, which
``tensorarena.empty_cache()`` calls for every workspace no call is using. The next call faults
the pages in again (zeroed), at about the cost of touching fresh memory.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from tensorarena.errors import ConcurrentUseError, InvalidArgumentError
from tensorarena.interop.empty_cache import hold_idle_memory, trim_pools
from tensorarena.memory.idle_pages import release_idle_pages
from tensorarena.runtime.device import CPU, check_arena
from tensorarena.runtime.materialize import block

if TYPE_CHECKING:
    import torch

    from tensorarena.memory.resource import MemoryResource

__all__ = ["GRANULE", "GRANULE_FROM", "Concurrency", "Workspace", "WorkspaceStatistics"]

Concurrency = Literal["serialize", "refuse"]

#: Blocks of at least ``GRANULE_FROM`` bytes are reserved in whole ``GRANULE``s (2 MiB, a huge
#: page): without it, a small block (a handed-over tail) took the end of the first block's
#: arena, and the re-planned block, a little larger, no longer fit there (ResNet-50 kept two
#: 20 MiB arenas resident for one 19 MiB plan).
GRANULE = 2 * 1024 * 1024
GRANULE_FROM = 1024 * 1024


class IdleBlocks(Protocol):
    """Blocks a program keeps beside its workspace for its outputs (the tail of handed-over
    outputs, the arenas of ``outputs="arena"``)."""

    def idle_blocks(self) -> list[torch.Tensor]:
        """Those of the blocks that nothing but the program uses now."""


@dataclass(frozen=True)
class WorkspaceStatistics:
    """``nbytes``: the block's size now; ``grows``: blocks taken so far; ``calls``: calls run."""

    nbytes: int
    grows: int
    calls: int


class Workspace:
    """One block of memory for the planned intermediates of one or more programs."""

    def __init__(
        self,
        resource: MemoryResource | None = None,
        *,
        concurrency: Concurrency = "serialize",
        device: str = CPU,
    ) -> None:
        if concurrency not in ("serialize", "refuse"):
            raise InvalidArgumentError(
                f"concurrency must be 'serialize' or 'refuse', got {concurrency!r}"
            )
        check_arena(resource, device)  # here, not at the first call that needs the block
        self.resource = resource
        #: where the block lives: ``"cpu"`` or ``"cuda:N"`` (:mod:`~tensorarena.runtime.device`)
        self.device = device
        self.concurrency: Concurrency = concurrency
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread id inside use()
        self._memory: torch.Tensor | None = None
        self._nbytes = 0
        self._generation = 0
        self._grows = 0
        self._calls = 0
        self._kept: weakref.WeakSet[IdleBlocks] = weakref.WeakSet()
        self._releasing = False  # release_idle_pages holds the lock (not a call)
        hold_idle_memory(self)  # tensorarena.empty_cache() gives its idle pages back

    @property
    def nbytes(self) -> int:
        """Bytes in the current block (0 before the first program needs any)."""
        return self._nbytes

    @property
    def generation(self) -> int:
        """Bumped every time the block is replaced: slots over an older generation are stale."""
        return self._generation

    @property
    def memory(self) -> torch.Tensor:
        """The current block (a ``torch.uint8`` tensor); call :meth:`reserve` first."""
        if self._memory is None:
            return self.reserve(0)
        return self._memory

    def reserve(self, nbytes: int) -> torch.Tensor:
        """The block, replaced by one of at least ``nbytes`` bytes first if it is smaller. A
        block of ``GRANULE_FROM`` bytes or more is rounded up to :data:`GRANULE` (the
        granularity of the default pool's large arenas): it then fills its arena, so the
        pool puts nothing else there, and the larger plan of a re-plan (kernels' own
        allocations added) usually fits in the same bytes."""
        if nbytes >= GRANULE_FROM:
            nbytes = -(-nbytes // GRANULE) * GRANULE
        memory = self._memory
        if memory is None or nbytes > self._nbytes:
            # Drop the old block first: where no slot holds it any more (programs release
            # their code before they reserve more), its bytes serve the new one, so growing
            # replaces the block instead of adding one. If the new block cannot be had, the
            # workspace is left empty (a new generation: no code over the old block runs) and
            # the next reserve tries again.
            replaced = memory is not None
            del memory
            self._memory, self._nbytes = None, 0
            self._generation += 1
            if replaced and self.device == CPU:
                # The old block, now free, may have left an arena of its own empty (a large
                # block gets one): give it back rather than keep it beside the new one.
                trim_pools(self.resource)
            memory = self._memory = block(nbytes, self.resource, device=self.device)
            self._nbytes = nbytes
            self._grows += 1
        return memory

    @contextmanager
    def use(self) -> Iterator[None]:
        """Hold the workspace for one call (see the module docstring for the policy)."""
        me = threading.get_ident()
        if self._owner == me:
            raise ConcurrentUseError(
                "a planned program was called from inside a call of a program that shares its "
                "workspace; give the inner one a Workspace of its own"
            )
        acquired = self._lock.acquire(blocking=self.concurrency == "serialize")
        if not acquired:  # a page release holds it for a moment: no call, so wait for it
            acquired = self._lock.acquire(blocking=self._releasing)
        if not acquired:
            raise ConcurrentUseError(
                "this planned program (or one sharing its workspace) is running in another "
                "thread; its intermediates share one block of memory, so calls cannot overlap "
                "(use concurrency='serialize' to wait, or one program per thread)"
            )
        self._owner = me
        try:
            self._calls += 1
            yield
        finally:
            self._owner = None
            self._lock.release()

    def keep_idle(self, kept: IdleBlocks) -> None:
        """Give ``kept``'s idle blocks back with the workspace's idle pages while ``kept``
        lives (its blocks are used only by calls made in :meth:`use`)."""
        self._kept.add(kept)

    def release_idle_pages(self) -> int:
        """Give the pages of the block, and of every idle block kept, back to the system, keeping
        their addresses (module docstring); return the bytes. Nothing while a call runs, and
        nothing off the CPU or where the memory is not private anonymous pages (pinned, shared
        or file-backed memory: :mod:`~tensorarena.memory.idle_pages`)."""
        if self.device != CPU or not self._lock.acquire(blocking=False):
            return 0
        self._releasing = True
        try:
            blocks = [self._memory] + [b for kept in list(self._kept) for b in kept.idle_blocks()]
            return sum(release_idle_pages(block.data_ptr(), block.nbytes)
                       for block in blocks if block is not None and block.nbytes)
        finally:
            self._releasing = False
            self._lock.release()

    def statistics(self) -> WorkspaceStatistics:
        """The block's size and how often it grew."""
        return WorkspaceStatistics(self._nbytes, self._grows, self._calls)

    def __repr__(self) -> str:
        return (
            f"Workspace(nbytes={self._nbytes}, device={self.device!r}, "
            f"generation={self._generation}, "
            f"concurrency={self.concurrency!r}, busy={self._owner is not None})"
        )
