"""scope(): frees what was made inside; an escaped array raises and keeps its bytes alive."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tensorarena.interop import Scope, ScopeEscapeError, current_scope, empty, scope, zeros
from tensorarena.memory.host import HostMemory


def _work(resource: HostMemory, keep: list[np.ndarray] | None = None) -> float:  # type: ignore[type-arg]
    """Make a few temporaries (optionally keeping one) and return a plain float."""
    a = zeros((64, 64), resource=resource)
    b = empty((64, 64), resource=resource)
    b[...] = 2.0
    c = a + b  # an ordinary numpy array: not from the resource
    if keep is not None:
        keep.append(b)
    return float(c.sum())


def test_arrays_made_inside_are_freed_when_it_ends() -> None:
    host = HostMemory()
    with scope(host) as current:
        assert current_scope() is current
        assert _work(host) == 2.0 * 64 * 64
        x = empty(10, resource=host)
        del x
    assert current_scope() is None
    assert current.allocations == 3
    assert host.live_blocks() == {}
    assert host.statistics().allocations.total == 3


def test_an_escaped_array_raises_and_keeps_its_bytes() -> None:
    host = HostMemory()
    kept: list[np.ndarray] = []  # type: ignore[type-arg]
    with pytest.raises(ScopeEscapeError) as error, scope(host):
        _work(host, keep=kept)
    assert len(error.value.escaped) == 1 and error.value.nbytes == 64 * 64 * 4
    assert "del a" in str(error.value)
    (escaped,) = kept
    address = escaped.ctypes.data
    assert host.live_blocks() == {address: 64 * 64 * 4}, "not freed under a live reference"
    assert (escaped == 2.0).all()  # the memory is intact and usable
    kept.clear()
    del escaped
    assert host.live_blocks() == {}, "freed as soon as the escaped array died"


def test_a_name_still_bound_at_the_end_counts_as_escaped() -> None:
    host = HostMemory()
    with pytest.raises(ScopeEscapeError), scope(host):
        still_bound = empty(100, resource=host)
    assert len(host.live_blocks()) == 1
    del still_bound
    assert host.live_blocks() == {}


def test_arrays_held_only_by_cycles_are_collected_at_the_end() -> None:
    host = HostMemory()

    def make_cycle() -> None:
        node: dict[str, object] = {"array": empty(1000, resource=host)}
        node["self"] = node  # unreachable after return, but refcounting alone cannot free it

    import gc

    gc.disable()
    try:
        with scope(host):
            make_cycle()
            assert len(host.live_blocks()) == 1
    finally:
        gc.enable()
    assert host.live_blocks() == {}


def test_an_exception_in_the_block_is_not_masked() -> None:
    host = HostMemory()
    with pytest.raises(KeyError), scope(host):
        array = empty(10, resource=host)
        raise KeyError("original")
    del array


def test_scope_resource_is_used_inside_and_inherited_by_nested_scopes() -> None:
    outer_host, other = HostMemory(), HostMemory()
    with scope(outer_host):
        a = empty(5)
        assert a.base.resource is outer_host
        with scope() as inner:
            b = empty(5)
            assert b.base.resource is outer_host
            c = empty(5, resource=other)  # an explicit resource wins
            assert c.base.resource is other
            del b, c
        assert inner.allocations == 2
        del a
    assert outer_host.live_blocks() == {} and other.live_blocks() == {}


def test_scopes_are_per_thread() -> None:
    host = HostMemory()
    from_thread: list[np.ndarray] = []  # type: ignore[type-arg]
    seen: list[Scope | None] = []

    def worker() -> None:
        seen.append(current_scope())
        from_thread.append(empty(10, resource=host))

    with scope(host) as current:
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert seen == [None]
    assert current.allocations == 0, "another thread's array is not this scope's"
    assert len(host.live_blocks()) == 1
    from_thread.clear()
    assert host.live_blocks() == {}


def test_many_arrays_in_one_scope_do_not_pile_up_references() -> None:
    host = HostMemory()
    with scope(host) as current:
        for _ in range(5000):
            empty(8, resource=host)
        assert len(current._refs) <= 1024
    assert current.allocations == 5000 and host.live_blocks() == {}


def test_scope_refuses_a_non_resource() -> None:
    with pytest.raises(TypeError), scope(object()):  # type: ignore[arg-type]
        pass
