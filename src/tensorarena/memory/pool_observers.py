"""Who watches a pool's calls: several observers per pool, and every pool of the process at once.

A :class:`~tensorarena.memory.Pool` tells an observer of each successful ``allocate`` and
``deallocate`` and each out-of-memory error, inside the call (so a free is seen before its address
can be handed out again). Two users may watch the same pool — ``record_memory_history`` and a
whole-program trace recording, say — so a pool keeps a tuple of observers and calls the one it
has directly, or an :class:`ObserverFanOut` of several: a pool nobody watches still pays a single
``is None`` test per call.

A recording of a whole program must see pools it never was handed: the default resource's, a
planned program's, one the program made itself, before or after the recording started.
:func:`watch_pools` calls a hook on every pool alive now and on every pool made until the
returned function is called. Pools are kept in a ``WeakSet`` (a pool that is collected leaves
it); the cost is one set insertion per pool made.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["ObservedPool", "ObserverFanOut", "PoolObserver", "observer_of", "register_pool",
           "watch_pools"]


class PoolObserver(Protocol):
    """Told of each successful call and each out-of-memory error, with the pool's lock held
    (a thread-safe pool). An observer must not raise, and one that takes a lock of its own
    must never call into the pool while holding it."""

    def allocated(self, address: int, nbytes: int) -> None: ...

    def freed(self, address: int, nbytes: int) -> None: ...

    def out_of_memory(self, nbytes: int) -> None: ...


class ObserverFanOut:
    """Several observers of one pool, called in the order they were added."""

    __slots__ = ("observers",)

    def __init__(self, observers: tuple[PoolObserver, ...]) -> None:
        self.observers = observers

    def allocated(self, address: int, nbytes: int) -> None:
        """Tell every observer of an allocation."""
        for observer in self.observers:
            observer.allocated(address, nbytes)

    def freed(self, address: int, nbytes: int) -> None:
        """Tell every observer of a free."""
        for observer in self.observers:
            observer.freed(address, nbytes)

    def out_of_memory(self, nbytes: int) -> None:
        """Tell every observer of an out-of-memory error."""
        for observer in self.observers:
            observer.out_of_memory(nbytes)


def observer_of(observers: tuple[PoolObserver, ...]) -> PoolObserver | None:
    """What a pool's calls tell: nobody, the one observer, or all of them in turn."""
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else ObserverFanOut(observers)


class ObservedPool:
    """The observer half of a :class:`~tensorarena.memory.Pool`: its ``_observers`` tuple,
    the ``_observer`` its calls tell (:func:`observer_of` them), and the one
    ``record_memory_history`` installed (``_history``), all changed under its ``_lock``."""

    _lock: Any
    _observers: tuple[PoolObserver, ...]
    _observer: PoolObserver | None
    _history: PoolObserver | None

    def add_observer(self, observer: PoolObserver) -> None:
        """Tell ``observer`` of every later allocation, free and out-of-memory error.

        It is called inside ``allocate``/``deallocate`` with the pool's lock held (a
        thread-safe pool), so a free is observed before its address can be handed out again,
        and a bound ``pool.allocate`` taken earlier is observed too. An observer must not
        raise; one that takes a lock of its own must never call into the pool while holding
        it (:class:`~tensorarena.memory.pool_observers.PoolObserver`).
        """
        with self._lock:
            self._observers += (observer,)
            self._observer = observer_of(self._observers)

    def remove_observer(self, observer: PoolObserver) -> None:
        """Stop telling ``observer`` (one that is not observing is ignored)."""
        with self._lock:
            kept = list(self._observers)
            for index, known in enumerate(kept):
                if known is observer:
                    del kept[index]
                    break
            self._observers = tuple(kept)
            self._observer = observer_of(self._observers)

    def _set_observer(self, observer: PoolObserver | None) -> None:
        """Replace the observer :func:`~tensorarena.report.record_memory_history` installed
        (None: remove it), leaving the others."""
        with self._lock:
            if self._history is not None:
                self.remove_observer(self._history)
            self._history = observer
            if observer is not None:
                self.add_observer(observer)


_lock = threading.Lock()
_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_hooks: list[Callable[[Any], None]] = []


def register_pool(pool: object) -> None:
    """Called by every pool as it is made: remembered, and given to every hook watching."""
    with _lock:
        _pools.add(pool)
        hooks = tuple(_hooks)
    for hook in hooks:
        hook(pool)


def watch_pools(hook: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``hook(pool)`` on every pool alive now and on every pool made from now on, until
    the returned function is called (which is idempotent)."""
    with _lock:
        _hooks.append(hook)
        alive = list(_pools)
    for pool in alive:
        hook(pool)

    def stop() -> None:
        with _lock:
            if hook in _hooks:
                _hooks.remove(hook)

    return stop
