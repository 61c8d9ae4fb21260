"""The array owner: every kind keeps the block while any view lives, and frees it once, after.

Each test runs through the owner kinds this build uses (the parameter ``route``): the native
owner where the C extension is built (every plain array), else the ``__array_interface__``
owner, which the first array of a byte count gets, and the ctypes block owner, which a byte
count gets from its second array on. Every test asserts which kind it actually got, so a change
of routing cannot silently leave one kind untested. ``tests/compiled/test_builds.py`` runs this
file again with the extension blocked, so the compiled build tests the ctypes kinds too.

The resource is a ``Pool``, whose first fit hands a freed block's address straight back: if a
block were freed while a view still used it, the next allocation of the same size would return
the same address (and the test would see it, and see the view's bytes overwritten).
"""

from __future__ import annotations

import copy
import ctypes
import functools
import gc
import importlib.util
import itertools
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal

import numpy as np
import pytest

from tensorarena.interop import Allocation, empty, scope, zeros
from tensorarena.interop.owner import (
    BLOCK_TYPES,
    InterfaceAllocation,
    NativeAllocation,
    block_type,
)
from tensorarena.interop.scope import ScopeEscapeError
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool

pytestmark = pytest.mark.usefixtures("no_unraisable")

ROUTES = ["native"] if NativeAllocation is not None else ["interface", "block"]
# Item counts no other test uses: the first array of each goes through the interface owner.
_fresh_counts = itertools.count(100_002, 2)


@pytest.fixture(autouse=True)
def room_for_block_types() -> Iterator[None]:
    """An empty block-type cache for each test (the whole suite may have filled it), restored
    after; owners made meanwhile keep their own types alive."""
    saved = dict(BLOCK_TYPES)
    BLOCK_TYPES.clear()
    yield
    BLOCK_TYPES.clear()
    BLOCK_TYPES.update(saved)


def _count_for(route: str, itemsize: int = 4) -> int:
    """An item count whose next array takes ``route``."""
    count = next(_fresh_counts)
    if route == "block":
        block_type(count * itemsize)
        assert block_type(count * itemsize) is not None, "the second sighting makes a type"
    return count


def _check_route(owner: object, route: str) -> None:
    assert isinstance(owner, Allocation)
    _check_type(type(owner), route)


def _check_type(owner_type: type, route: str) -> None:
    if route == "block":
        assert owner_type.__name__.startswith("Block") and issubclass(owner_type, ctypes.Array)
    else:
        expected = NativeAllocation if route == "native" else InterfaceAllocation
        assert owner_type is expected, owner_type


def _made_in_scope(make: Callable[[], Any]) -> tuple[Any, type]:
    """``make()`` and the type of the owner it made (a scope records owners; a tensor does not
    show its own). The scope reports the result as escaped, which is expected here."""
    with pytest.raises(ScopeEscapeError), scope() as current:
        made = make()
        (owner,) = current.live()
        owner_type = type(owner)
        del owner
    return made, owner_type


def _pool() -> Pool:
    return Pool(HostMemory(), initial_size="4MiB")


NUMPY_VIEWS: dict[str, Callable[[Any], Any]] = {
    "slice": lambda a: a[1:],
    "strided transpose": lambda a: a.reshape(-1, 2)[::2].T,
    "view as another dtype": lambda a: a.view(np.uint8),
    "np.asarray of a slice": lambda a: np.asarray(a[3:]),
    "view of a view of a view": lambda a: a[1:][1:].view(np.int32)[::3],
    "memoryview": lambda a: memoryview(a),
    "frombuffer of the array": lambda a: np.frombuffer(a, np.uint8),
    "the owner itself": lambda a: a.base,
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("make_view", NUMPY_VIEWS.values(), ids=list(NUMPY_VIEWS))
def test_a_numpy_view_keeps_the_block_until_it_dies(
    route: str, make_view: Callable[[Any], Any]
) -> None:
    pool = _pool()
    count = _count_for(route)
    array = empty(count, np.float32, resource=pool)
    _check_route(array.base, route)
    address, nbytes = array.ctypes.data, array.nbytes
    array[:] = 7.0
    view = make_view(array)
    del array
    gc.collect()
    assert pool.live_blocks() == {address: nbytes}, "a view is alive: the block must stay"
    other = empty(count, np.float32, resource=pool)
    assert other.ctypes.data != address, "the live block was handed out again"
    other[:] = 3.0
    intact = np.frombuffer(ctypes.string_at(address, nbytes), np.float32)
    assert (intact == 7.0).all(), "the view's bytes were overwritten"
    del other
    assert pool.live_blocks() == {address: nbytes}
    del view
    gc.collect()
    assert pool.live_blocks() == {}, "the last view died: the block must be back"
    assert pool.statistics().allocations.total == 2


@pytest.mark.parametrize("route", ROUTES)
def test_the_block_goes_back_only_after_the_last_of_many_views(route: str) -> None:
    pool = _pool()
    array = empty((_count_for(route),), np.float32, resource=pool)
    _check_route(array.base, route)
    address = array.ctypes.data
    views = [make(array) for make in NUMPY_VIEWS.values()]
    del array
    while views:
        gc.collect()
        assert address in pool.live_blocks()
        views.pop()
    gc.collect()
    assert pool.live_blocks() == {}
    assert pool.statistics().allocations.current == 0


TORCH_VIEWS: dict[str, Callable[[Any], Any]] = {
    "slice": lambda t: t[1:],
    "view as another dtype": lambda t: t.view(__import__("torch").int32),
    "reshape and transpose": lambda t: t.reshape(-1, 2).T,
    "numpy of the tensor": lambda t: t.numpy(),
    "numpy slice of a tensor slice": lambda t: t[2:].numpy()[3:],
    "the storage alone": lambda t: t.untyped_storage(),
    "detach": lambda t: t.detach(),
    "as_strided": lambda t: t.as_strided((4,), (2,), 1),
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("make_view", TORCH_VIEWS.values(), ids=list(TORCH_VIEWS))
def test_a_torch_view_keeps_the_block_until_it_dies(
    route: str, make_view: Callable[[Any], Any]
) -> None:
    torch = pytest.importorskip("torch")
    pool = _pool()
    count = _count_for(route)
    tensor, owner_type = _made_in_scope(
        lambda: empty(count, np.float32, resource=pool, like="torch")
    )
    _check_type(owner_type, route)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    address, nbytes = tensor.data_ptr(), tensor.nbytes
    assert pool.live_blocks() == {address: nbytes}
    tensor.fill_(7.0)
    view = make_view(tensor)
    del tensor
    gc.collect()
    assert pool.live_blocks() == {address: nbytes}, "a view is alive: the block must stay"
    other = empty(count, np.float32, resource=pool, like="torch")
    assert other.data_ptr() != address, "the live block was handed out again"
    other.fill_(3.0)
    intact = np.frombuffer(ctypes.string_at(address, nbytes), np.float32)
    assert (intact == 7.0).all(), "the view's bytes were overwritten"
    del other
    del view
    gc.collect()
    assert pool.live_blocks() == {}, "the last view died: the block must be back"
    assert pool.statistics().allocations.total == 2


@pytest.mark.parametrize("route", ROUTES)
def test_torch_dtypes_and_shapes_on_both_routes(route: str) -> None:
    torch = pytest.importorskip("torch")
    pool = _pool()
    for dtype, ndim in ((torch.bfloat16, 1), (np.int16, 2)):
        count = _count_for(route, itemsize=2)
        shape = (count,) if ndim == 1 else (count // 2, 2)
        tensor, owner_type = _made_in_scope(
            functools.partial(empty, shape, dtype, resource=pool, like="torch")
        )
        _check_type(owner_type, route)
        assert tuple(tensor.shape) == shape and tensor.is_contiguous()
        tensor.fill_(3)
        assert float(tensor.float().sum()) == 3 * count
        assert pool.live_blocks() == {tensor.data_ptr(): 2 * count}
        del tensor
        gc.collect()
        assert pool.live_blocks() == {}


@pytest.mark.parametrize("route", ROUTES)
def test_the_owner_exposes_exactly_the_block(route: str) -> None:
    pool = _pool()
    count = _count_for(route)
    array = empty((count, 1), np.float32, resource=pool)  # n-d: np.ndarray(buffer=owner)
    owner = array.base
    _check_route(owner, route)
    assert array.shape == (count, 1) and array.flags.c_contiguous and array.flags.writeable
    assert owner.address == array.ctypes.data and owner.nbytes == array.nbytes
    assert owner.resource is pool
    if route != "interface":
        assert memoryview(owner).nbytes == array.nbytes, "no buffer beyond the block"
    assert f"{owner.address:#x}" in repr(owner)


@pytest.mark.parametrize("route", ROUTES)
def test_an_owner_cannot_be_copied(route: str) -> None:
    pool = _pool()
    array = empty(_count_for(route), np.float32, resource=pool)
    _check_route(array.base, route)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied"):
            duplicate(array.base)
    assert pickle.loads(pickle.dumps(array)).nbytes == array.nbytes  # the array copies bytes
    del array
    assert pool.live_blocks() == {}


@pytest.mark.parametrize("shape", [(0, 3), (0,)])
@pytest.mark.parametrize("like", ["numpy", "torch"])
def test_zero_size_arrays_have_a_block_and_free_it(
    like: Literal["numpy", "torch"], shape: tuple[int, ...]
) -> None:
    if like == "torch":
        pytest.importorskip("torch")
    pool = _pool()
    block_type(1)  # a zero-size array asks for 1 byte: give that size a block-owner type
    assert block_type(1) is not None
    # 1-d: the 1-byte block holds no whole float32, so NumPy must not be asked for one (it was).
    array, owner_type = _made_in_scope(lambda: empty(shape, np.float32, resource=pool, like=like))
    # NumPy takes the block owner; torch.frombuffer refuses 0 items, so a tensor takes the other.
    _check_type(owner_type, "interface" if like == "torch" else ROUTES[-1])
    assert tuple(array.shape) == shape and len(pool.live_blocks()) == 1
    del array
    assert pool.live_blocks() == {}


@pytest.mark.parametrize("route", ROUTES)
def test_structured_dtypes_and_zeros_on_both_routes(route: str) -> None:
    pool = _pool()
    record = np.dtype(
        {"names": ["a", "b"], "formats": ["u1", "f8"], "offsets": [0, 8], "itemsize": 24}
    )
    count = _count_for(route, itemsize=24)
    array = zeros(count, record, resource=pool)
    owner = array.base if isinstance(array.base, Allocation) else array.base.base
    _check_route(owner, route)
    del owner
    assert array.dtype == record and (array["b"] == 0).all()
    array["b"] = 2.5
    assert array["b"].sum() == 2.5 * count
    del array
    assert pool.live_blocks() == {}


@pytest.mark.parametrize("route", ROUTES)
def test_a_scope_sees_both_owner_kinds(route: str) -> None:
    pool = _pool()
    count = _count_for(route)
    with pytest.raises(ScopeEscapeError), scope(pool):
        kept = empty(count, np.float32)
        _check_route(kept.base, route)
    assert len(pool.live_blocks()) == 1, "an escaped array keeps its bytes"
    del kept
    assert pool.live_blocks() == {}


def test_the_type_cache_is_bounded_and_falls_back_to_the_interface_owner() -> None:
    # In a child: filling the cache would send the other tests' new sizes down one route.
    # The compiled build uses no ctypes types: the child blocks the native owner to test them.
    script = """
import sys
sys.modules["tensorarena.interop._native_owner"] = None
import numpy as np
from tensorarena.interop import empty
from tensorarena.interop.owner import BLOCK_TYPES, MAX_BLOCK_TYPES, InterfaceAllocation
from tensorarena.memory.host import HostMemory
host = HostMemory()
for size in range(1, MAX_BLOCK_TYPES + 40):
    for _ in range(3):
        array = empty(size, np.uint8, resource=host)
        array[:] = 1
        del array
assert len(BLOCK_TYPES) == MAX_BLOCK_TYPES, len(BLOCK_TYPES)
late = empty(MAX_BLOCK_TYPES + 20, np.uint8, resource=host)
assert type(late.base) is InterfaceAllocation
del late
assert host.live_blocks() == {}
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-800:]


@pytest.mark.parametrize("route", ROUTES)
def test_arrays_over_a_block_cannot_grow_past_it(route: str) -> None:
    pool = _pool()
    count = _count_for(route)
    array = empty(count, np.float32, resource=pool)
    _check_route(array.base, route)
    with pytest.raises(ValueError, match="does not own its data"):
        array.resize(4 * count)
    if importlib.util.find_spec("torch") is not None:
        tensor = empty(count, np.float32, resource=pool, like="torch")  # the block route now
        with pytest.raises(RuntimeError, match="not resizable"):
            tensor.resize_(4 * count)
        del tensor
    del array
    assert pool.live_blocks() == {}
