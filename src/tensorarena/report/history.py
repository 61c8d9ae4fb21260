"""``record_memory_history``, ``memory_snapshot``, ``dump_snapshot``: PyTorch's calls, on any pool.

PyTorch users find a memory problem with three calls: ``torch.cuda.memory._record_memory_history()``
before the code, ``_dump_snapshot("x.pickle")`` after it, and the viewer at
pytorch.org/memory_viz. The same three work here, on the default resource or on any pool:

    ta.report.record_memory_history(max_entries=100_000)      # the default resource's pool
    ...                                                       # the program
    ta.report.dump_snapshot("memory.pickle")                  # open it in memory_viz

Recording attaches to the pool itself, not to a wrapper around it: a pool is shared by
reference (a thread cache above it, arrays that free into it, other code that was handed it, a
bound ``pool.allocate`` kept from before), and every one of those calls must be seen. So the
history registers as the pool's observer (``Pool._set_observer``): ``Pool.allocate`` and
``deallocate`` tell it of each call, inside the call, and ``record_memory_history(False)``
removes it. Nothing is bound on the pool instance (a compiled native class cannot shadow its
methods); a pool that is not recording pays one attribute test per call. A layer that is not a
``Pool`` (an adaptor with ``live_blocks()``) has its instance's ``allocate``/``deallocate``
replaced by recording ones instead, put back on stopping. Given an adaptor stack, the history
attaches to the first pool below (the layer whose arenas the snapshot shows), so a thread cache's
hits are not in the history — as PyTorch's history shows its caching allocator's calls, not the
program's.

The history is a bounded ring (``max_entries``, PyTorch's parameter) of PyTorch's actions:
``alloc``, ``free_requested`` + ``free_completed`` (a host pool's free is reusable at once),
``segment_alloc`` when the pool took a new arena (seen when an allocation lands outside the
arenas known so far; arenas given back by ``trim()`` are noticed at the dump), and ``oom``. With
``stacks="python"`` each action carries the Python stack of the code that called into
tensorarena (:mod:`tensorarena.adaptors.sites` says what that costs). A pool's observer is
called with the pool's lock held, so a free is recorded before another thread can be handed the
address (on a patched layer the history's lock spans the call); locks are taken pool first,
history second.

The snapshot (:func:`memory_snapshot`) is the pool's state (:func:`~tensorarena.report.snapshot`)
with the history as its device trace, made into PyTorch's format by the writer of
:mod:`tensorarena.trace`; :func:`dump_snapshot` writes it atomically as a protocol-4 pickle.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from tensorarena.adaptors.sites import Stack, capture
from tensorarena.adaptors.tracking import check_stack_depth
from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import DEFAULT_ALIGNMENT, Stream
from tensorarena.report.snapshot import MemorySnapshot, find_pool, snapshot
from tensorarena.sizes import MAX_SIZE, check_address, check_nbytes
from tensorarena.trace import SnapshotAction, write_snapshot

__all__ = [
    "MemoryHistory",
    "dump_snapshot",
    "memory_history",
    "memory_snapshot",
    "record_memory_history",
]

_histories: weakref.WeakKeyDictionary[object, MemoryHistory] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def _now_us() -> int:
    return time.perf_counter_ns() // 1000


class MemoryHistory:
    """The recorded actions of one pool (see the module docstring); made by
    :func:`record_memory_history`, read by :func:`memory_snapshot`."""

    def __init__(self, pool: object, *, max_entries: int, stack_depth: int) -> None:
        self._pool = pool
        self._depth = stack_depth
        self._entries: deque[tuple[SnapshotAction, Stack]] = deque(maxlen=max_entries)
        self._lock = threading.Lock()
        self._per_block = not hasattr(pool, "arenas")  # each block is its own mapping
        self._segments: list[tuple[int, int]] = []  # (base, size), sorted: the arenas known
        self._bases: list[int] = []
        self._saved: dict[str, Any] = {}
        self._attached = False

    @property
    def pool(self) -> object:
        """The layer being recorded."""
        return self._pool

    @property
    def max_entries(self) -> int:
        """The most actions kept (the oldest are dropped first)."""
        return self._entries.maxlen or 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> tuple[tuple[SnapshotAction, Stack], ...]:
        """The recorded actions with their stacks, oldest first."""
        with self._lock:
            return tuple(self._entries)

    # --- attaching ---------------------------------------------------------------------------

    def _attach(self) -> None:
        pool = self._pool
        if isinstance(pool, Pool):
            with pool._lock, self._lock:  # the pool's lock first, as in the pool's calls
                self._refresh_segments(_now_us(), emit=False)
                pool._set_observer(self)
        else:  # another layer with live_blocks() (an adaptor): its instance's calls are patched
            with self._lock:
                self._refresh_segments(_now_us(), emit=False)
            for name in ("allocate", "deallocate"):
                if name in vars(pool):
                    self._saved[name] = vars(pool)[name]
            allocate, deallocate = pool.allocate, pool.deallocate  # type: ignore[attr-defined]
            pool.allocate = functools.partial(self._record_allocate, allocate)  # type: ignore[attr-defined]
            pool.deallocate = functools.partial(self._record_deallocate, deallocate)  # type: ignore[attr-defined]
        self._attached = True

    def _detach(self) -> None:
        if not self._attached:
            return
        pool = self._pool
        if isinstance(pool, Pool):
            pool._set_observer(None)
        else:
            for name in ("allocate", "deallocate"):
                if name in self._saved:
                    setattr(pool, name, self._saved[name])
                else:
                    vars(pool).pop(name, None)
        self._attached = False

    # --- recording: a Pool's observer (called with the pool's lock held) --------------------

    def allocated(self, address: int, nbytes: int) -> None:
        """Record an allocation (the pool's :class:`~tensorarena.memory.pool.PoolObserver`)."""
        stack = capture(self._depth) if self._depth else ()
        now = _now_us()
        with self._lock:
            if self._per_block:
                self._entries.append((SnapshotAction("segment_alloc", address, nbytes, 0, now),
                                      stack))
            elif not self._known(address):
                self._refresh_segments(now, emit=True)
            self._entries.append((SnapshotAction("alloc", address, nbytes, 0, now), stack))

    def freed(self, address: int, nbytes: int) -> None:
        """Record a free: the pool still holds its lock, so before any reuse of the address."""
        stack = capture(self._depth) if self._depth else ()
        with self._lock:
            self._record_free(address, nbytes, stack)

    def out_of_memory(self, nbytes: int) -> None:
        """Record an out-of-memory error."""
        stack = capture(self._depth) if self._depth else ()
        with self._lock:
            self._entries.append((SnapshotAction("oom", 0, nbytes, 0, _now_us()), stack))

    def _record_free(self, address: int, nbytes: int, stack: Stack) -> None:
        now = _now_us()
        entries = self._entries
        entries.append((SnapshotAction("free_requested", address, nbytes, 0, now), stack))
        entries.append((SnapshotAction("free_completed", address, nbytes, 0, now), stack))
        if self._per_block:
            entries.append((SnapshotAction("segment_free", address, nbytes, 0, now), stack))

    # --- recording: another layer's patched calls --------------------------------------------

    def _record_allocate(
        self,
        call: Callable[[int, int, Stream], int],
        nbytes: int,
        alignment: int = DEFAULT_ALIGNMENT,
        stream: Stream = None,
    ) -> int:
        if type(nbytes) is not int or not 0 < nbytes <= MAX_SIZE:
            nbytes = check_nbytes(nbytes)
        try:
            address = call(nbytes, alignment, stream)
        except MemoryError:
            self.out_of_memory(nbytes)
            raise
        self.allocated(address, nbytes)
        return address

    def _record_deallocate(
        self,
        call: Callable[[int, int, Stream], None],
        address: int,
        nbytes: int,
        stream: Stream = None,
    ) -> None:
        if type(address) is not int:
            address = check_address(address)
        if type(nbytes) is not int:
            nbytes = check_nbytes(nbytes)
        stack = capture(self._depth) if self._depth else ()
        with self._lock:  # held across the call: the free is recorded before any reuse
            call(address, nbytes, stream)
            self._record_free(address, nbytes, stack)

    # --- segments ----------------------------------------------------------------------------

    def _known(self, address: int) -> bool:
        index = bisect.bisect_right(self._bases, address) - 1
        return index >= 0 and address < self._segments[index][0] + self._segments[index][1]

    def _refresh_segments(self, now: int, *, emit: bool) -> None:
        """Read the pool's arenas; with ``emit``, record what changed (lock held)."""
        if self._per_block:
            return
        current = sorted((a.base, a.capacity) for a in self._pool.arenas)  # type: ignore[attr-defined]
        if emit:
            before, after = set(self._segments), set(current)
            for base, size in sorted(before - after):
                self._entries.append((SnapshotAction("segment_free", base, size, 0, now), ()))
            for base, size in sorted(after - before):
                self._entries.append((SnapshotAction("segment_alloc", base, size, 0, now), ()))
        self._segments = current
        self._bases = [base for base, _ in current]

    def state(self) -> tuple[MemorySnapshot, tuple[tuple[SnapshotAction, Stack], ...]]:
        """The pool's state now (live blocks with their stacks from the history) and the
        history that ends in it, read together under the lock."""
        pool = self._pool
        # The pool's lock first, then the history's: the order of the pool's observed calls.
        with pool._lock if isinstance(pool, Pool) else contextlib.nullcontext(), self._lock:
            self._refresh_segments(_now_us(), emit=True)
            stacks: dict[int, Stack] = {}
            for action, stack in self._entries:
                if action.action == "alloc":
                    stacks[action.address] = stack
            return snapshot(self._pool, stacks=stacks), tuple(self._entries)

    def __repr__(self) -> str:
        return (
            f"MemoryHistory({type(self._pool).__name__}, entries={len(self._entries)}/"
            f"{self.max_entries}, stack_depth={self._depth})"
        )


# --- the public calls ----------------------------------------------------------------------


def _target(resource: object) -> object:
    if resource is None:
        from tensorarena.interop.default import default_resource

        resource = default_resource()
    return find_pool(resource)


def record_memory_history(
    enabled: bool | str | None = "all",
    *,
    resource: object = None,
    max_entries: int = 100_000,
    stacks: str | None = "python",
    stack_depth: int = 16,
) -> MemoryHistory | None:
    """Start (``enabled`` True or ``"all"``) or stop (False or None) recording the pool of
    ``resource`` (default: the default resource). Starting again replaces the history.

    ``max_entries`` bounds the ring of actions; ``stacks="python"`` records ``stack_depth``
    frames per action, ``stacks=None`` none. Returns the :class:`MemoryHistory` (None when
    stopping).
    """
    if enabled in (True, "all"):
        on = True
    elif enabled in (False, None):
        on = False
    else:
        raise InvalidArgumentError(
            f"enabled must be True/'all' (record) or False/None (stop), got {enabled!r}"
        )
    if type(max_entries) is not int or max_entries < 1:
        raise InvalidArgumentError(f"max_entries must be a positive int, got {max_entries!r}")
    if stacks not in ("python", "all", None):
        raise InvalidArgumentError(
            f"stacks must be 'python' (or 'all': Python is all there is here) or None, "
            f"got {stacks!r}"
        )
    depth = 0 if stacks is None else check_stack_depth(stack_depth)
    pool = _target(resource)
    with _registry_lock:
        previous = _histories.pop(pool, None)
        if previous is not None:
            previous._detach()
        if not on:
            return None
        history = MemoryHistory(pool, max_entries=max_entries, stack_depth=depth)
        try:
            history._attach()
        except (AttributeError, TypeError) as exc:  # a slotted class: no instance attributes
            raise InvalidArgumentError(
                f"cannot record {type(pool).__name__}: its calls cannot be intercepted "
                f"({exc}); record a Pool over it instead"
            ) from exc
        _histories[pool] = history
        return history


def memory_history(resource: object = None) -> MemoryHistory | None:
    """The history recording ``resource``'s pool (default: the default resource's), or None."""
    return _histories.get(_target(resource))


def memory_snapshot(resource: object = None) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()``: the pool's segments and blocks now and, if it is
    recording, its history, as PyTorch's snapshot dict."""
    pool = _target(resource)
    history = _histories.get(pool)
    if history is None:
        return snapshot(resource if resource is not None else pool).to_pytorch()
    state, entries = history.state()
    return state.to_pytorch(entries)


def dump_snapshot(path: str | os.PathLike[str], *, resource: object = None) -> None:
    """``torch.cuda.memory._dump_snapshot(path)``: write :func:`memory_snapshot` as a pickle
    that pytorch.org/memory_viz and ``torch.cuda._memory_viz`` open (atomically)."""
    write_snapshot(memory_snapshot(resource), path)
