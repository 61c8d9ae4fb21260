"""``empty``'s compiled entry (``_native_empty.FastEmpty``, see ``interop/_entry.py``).

The entry makes ``empty(n, dtype)`` (a plain NumPy dtype) and ``empty(n, dtype, like="torch")``
(a DLPack-routed dtype) itself where the resource is the default and no scope is active, and
hands every other call to the Python ``empty`` unchanged. Most tests build an entry of their own
in front of a recording ``general`` and over a recording default resource, so that which side
made an array, and every block's way back, can be seen. Skipped in the pure build (``empty`` is
the function there) or without torch.
"""

from __future__ import annotations

import contextvars
import gc
import threading
import weakref
from typing import Any

import numpy as np
import pytest

import tensorarena
from _recording import RecordingResource
from tensorarena.interop import arrays, empty, scope
from tensorarena.interop._entry import source_docstring
from tensorarena.interop._torch_route import ROUTES, TorchRoute
from tensorarena.interop.owner import native_owner
from tensorarena.memory.resource import DEFAULT_ALIGNMENT
from tensorarena.sizes import MAX_SIZE

torch = pytest.importorskip("torch")
native_empty = pytest.importorskip(
    "tensorarena.interop._native_empty", reason="the pure build has no compiled entry"
)

pytestmark = pytest.mark.usefixtures("no_unraisable")

FLOAT32 = 2 | 32 << 8  # DLPack kDLFloat, 32 bits


class Recorder:
    """The ``general`` behind a test's entry: records each call and answers ``"general"``."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        return "general"


class Setup:
    """An entry over its own routes, scope variable and default namespace; with ``numpy``, its
    own dtype table too (NumPy calls made by the entry), else every NumPy call is general's."""

    def __init__(self, resource: Any = None, numpy: bool = False) -> None:
        self.general = Recorder()
        self.resource = RecordingResource() if resource is None else resource
        self.scope_var: contextvars.ContextVar[Any] = contextvars.ContextVar("s", default=None)
        self.defaults: dict[str, Any] = {"_default": self.resource}
        empty(1, np.float32, like="torch")  # the real route of np.float32, worked out once
        self.routes: dict[Any, Any] = {np.float32: ROUTES[np.float32]}
        arrays.empty(1, np.float32)
        self.dtypes: dict[Any, Any] = {np.float32: arrays.DTYPES[np.float32]}
        extra: dict[str, Any] = {}
        if numpy:
            extra = {"dtypes": self.dtypes, "owner": native_owner, "frombuffer": np.frombuffer,
                     "default_dtype": np.float32}
        self.entry = native_empty.FastEmpty(
            self.general, self.routes, self.scope_var, self.defaults, DEFAULT_ALIGNMENT, MAX_SIZE,
            **extra,
        )

    def allocated(self) -> dict[int, int]:
        return self.resource.live()


# --- the public object ---------------------------------------------------------------------------


def test_the_public_empty_is_the_entry_in_front_of_the_function() -> None:
    assert isinstance(empty, native_empty.FastEmpty)
    assert tensorarena.empty is empty
    assert empty.__wrapped__ is arrays.empty
    assert empty.__name__ == "empty" and empty.__module__ == "tensorarena.interop"
    assert repr(empty) == f"<compiled entry of {arrays.empty!r}>"
    # mypyc drops docstrings: the entry carries the one written in arrays.py.
    assert empty.__doc__ is not None and empty.__doc__.startswith("A C-contiguous array of")


def test_source_docstring_reads_the_py_file_or_gives_none() -> None:
    doc = source_docstring(arrays.zeros)
    assert doc is not None and doc.startswith("Like :func:`empty`, with every byte zero")
    assert "\n    " not in doc  # cleaned as inspect.getdoc cleans
    assert source_docstring(print) is None  # no module file
    assert source_docstring(arrays._resolve_dtype) is None  # written without one


# --- the path it takes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda e: e(16, np.float32, like="torch"),
        lambda e: e(16, dtype=np.float32, like="torch"),
        lambda e: e(16, like="torch", dtype=np.float32),
    ],
    ids=["positional-dtype", "keyword-dtype", "keywords-swapped"],
)
def test_the_repeated_call_is_made_here(call: Any) -> None:
    setup = Setup()
    tensor = call(setup.entry)
    assert setup.general.calls == []
    assert tensor.dtype == torch.float32 and tensor.shape == (16,) and tensor.stride() == (1,)
    assert setup.allocated() == {tensor.data_ptr(): 64}
    assert tensor.data_ptr() % DEFAULT_ALIGNMENT == 0
    del tensor
    assert setup.allocated() == {} and len(setup.resource.freed) == 1


def _not_interned_torch() -> str:
    return "".join(["tor", "ch"])


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((16, np.float32), {}),  # like="numpy", and this entry has no NumPy path
        ((16, np.float32), {"like": "numpy"}),
        ((16,), {"like": "torch"}),  # the default dtype: not handled here
        ((16, np.float32), {"like": "torch", "resource": None}),
        ((16, np.float32), {"like": "torch", "alignment": 64}),
        ((16, np.float32, None), {"like": "torch"}),  # too many positional
        ((), {"shape": 16, "dtype": np.float32, "like": "torch"}),
        ((0, np.float32), {"like": "torch"}),  # zero items: the Python path's 1-byte block
        ((-1, np.float32), {"like": "torch"}),
        ((True, np.float32), {"like": "torch"}),  # not an exact int
        ((np.int64(16), np.float32), {"like": "torch"}),
        (((4, 4), np.float32), {"like": "torch"}),
        ((MAX_SIZE // 4 + 1, np.float32), {"like": "torch"}),  # over the limit
        ((2**70, np.float32), {"like": "torch"}),
        ((16, np.float64), {"like": "torch"}),  # no route known yet
        ((16, [1]), {"like": "torch"}),  # unhashable
        ((16, np.float32), {"like": "Torch"}),
    ],
    ids=[
        "numpy-default", "numpy", "default-dtype", "resource", "alignment", "three-positional",
        "shape-by-name", "zero", "negative", "bool", "np-int", "tuple", "over-limit", "huge",
        "unrouted-dtype", "unhashable-dtype", "bad-like",
    ],
)
def test_every_other_call_goes_to_the_function_as_it_came(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    setup = Setup()
    assert setup.entry(*args, **kwargs) == "general"
    assert setup.general.calls == [(args, kwargs)]
    assert setup.allocated() == {}


def test_a_like_equal_to_torch_but_not_the_interned_string_goes_to_the_function() -> None:
    setup = Setup()
    assert setup.entry(16, np.float32, like=_not_interned_torch()) == "general"


def test_inside_a_scope_the_function_makes_it() -> None:
    setup = Setup()
    token = setup.scope_var.set(object())
    try:
        assert setup.entry(16, np.float32, like="torch") == "general"
    finally:
        setup.scope_var.reset(token)
    assert setup.entry(16, np.float32, like="torch").shape == (16,)
    assert len(setup.general.calls) == 1


def test_the_real_entry_leaves_scopes_to_the_function() -> None:
    resource = RecordingResource()
    with scope(resource) as current:
        tensor = empty(16, np.float32, like="torch")
        assert [owner.address for owner in current.live()] == [tensor.data_ptr()]
        del tensor
    assert resource.live() == {} and len(resource.freed) == 1


def test_no_default_resource_yet_goes_to_the_function() -> None:
    setup = Setup()
    setup.defaults["_default"] = None
    assert setup.entry(16, np.float32, like="torch") == "general"
    del setup.defaults["_default"]
    assert setup.entry(16, np.float32, like="torch") == "general"
    assert len(setup.general.calls) == 2


def test_a_new_default_resource_is_used_at_the_next_call() -> None:
    setup = Setup()
    other = RecordingResource()
    first = setup.entry(16, np.float32, like="torch")
    setup.defaults["_default"] = other
    second = setup.entry(16, np.float32, like="torch")
    assert setup.resource.live() == {first.data_ptr(): 64}
    assert other.live() == {second.data_ptr(): 64}
    del first, second
    assert setup.resource.live() == {} and other.live() == {}


def test_a_frombuffer_route_is_remembered_as_the_functions() -> None:
    setup = Setup()
    route = ROUTES[np.float32]
    setup.routes[np.float64] = TorchRoute(np.float64, route.entry, torch, None, None, None)
    for _ in range(2):
        assert setup.entry(16, np.float64, like="torch") == "general"
    assert len(setup.general.calls) == 2


def test_a_route_whose_code_disagrees_with_its_item_size_is_the_functions() -> None:
    setup = Setup()
    route = ROUTES[np.float32]
    wide = 2 | 64 << 8  # 8-byte items for a 4-byte entry
    from_dlpack = torch._C._from_dlpack
    setup.routes[np.int32] = TorchRoute(np.int32, route.entry, torch, None, wide, from_dlpack)
    assert setup.entry(16, np.int32, like="torch") == "general"


def test_forget_drops_the_remembered_route() -> None:
    setup = Setup()
    setup.entry(16, np.float32, like="torch")
    setup.routes.clear()
    assert setup.entry(16, np.float32, like="torch").shape == (16,)  # remembered
    setup.entry.forget()
    assert setup.entry(16, np.float32, like="torch") == "general"


# --- NumPy arrays ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda e: e(16, np.float32),
        lambda e: e(16),
        lambda e: e(16, dtype=np.float32),
        lambda e: e(16, np.float32, like="numpy"),
        lambda e: e(16, like="numpy"),
    ],
    ids=["positional", "default-dtype", "keyword", "like-numpy", "like-numpy-default-dtype"],
)
def test_a_numpy_array_is_made_here_over_an_owner_of_its_block(call: Any) -> None:
    setup = Setup(numpy=True)
    array = call(setup.entry)
    assert setup.general.calls == []
    assert type(array) is np.ndarray and array.dtype == np.float32 and array.shape == (16,)
    assert type(array.base).__name__ == "NativeAllocation"
    assert setup.allocated() == {array.ctypes.data: 64}
    array[:] = 1.5
    assert float(array.sum()) == 24.0
    view = array[4:8]
    del array
    assert len(setup.allocated()) == 1, "a view keeps the block"
    del view
    assert setup.allocated() == {} and len(setup.resource.freed) == 1


def test_the_default_dtype_is_the_functions() -> None:
    assert empty(4).dtype == arrays.empty(4).dtype == np.float32


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((16, np.dtype([("a", "u1"), ("b", "f4")])), {}),  # structured
        ((16, torch.bfloat16), {}),  # a torch dtype needs like="torch" (the function says so)
        ((16, np.float64), {}),  # not resolved yet
        (((4, 4), np.float32), {}),
        ((0, np.float32), {}),
        ((np.int64(16), np.float32), {}),
        ((16, np.float32), {"resource": None}),
        ((16, np.float32), {"alignment": 64}),
    ],
    ids=["structured", "torch-dtype", "unresolved", "n-d", "zero", "np-int", "resource", "align"],
)
def test_other_numpy_calls_go_to_the_function(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    setup = Setup(numpy=True)  # its table: float32, a structured dtype and a torch dtype
    for dtype in (np.dtype([("a", "u1"), ("b", "f4")]), torch.bfloat16):
        arrays.empty(1, dtype, like="torch" if dtype is torch.bfloat16 else "numpy")
        setup.dtypes[dtype] = arrays.DTYPES[dtype]
    assert setup.entry(*args, **kwargs) == "general"
    assert setup.general.calls == [(args, kwargs)]
    assert setup.allocated() == {}


def test_a_bad_address_for_a_numpy_array_is_refused_and_given_back() -> None:
    class Odd(RecordingResource):
        def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> Any:
            return -4096

        def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
            self.freed.append((address, nbytes))

    setup = Setup(Odd(), numpy=True)
    with pytest.raises(ValueError, match="address"):
        setup.entry(16, np.float32)
    assert setup.resource.freed == [(-4096, 64)]


def test_a_failing_frombuffer_gives_the_block_back() -> None:
    def refuse(owner: Any, dtype: Any) -> Any:
        raise RuntimeError("frombuffer failed")

    setup = Setup(numpy=True)
    entry = native_empty.FastEmpty(
        setup.general, setup.routes, setup.scope_var, setup.defaults, DEFAULT_ALIGNMENT,
        MAX_SIZE, dtypes=setup.dtypes, owner=native_owner, frombuffer=refuse,
    )
    with pytest.raises(RuntimeError, match="frombuffer failed"):
        entry(16, np.float32)
    gc.collect()
    assert setup.allocated() == {} and len(setup.resource.freed) == 1


def test_an_allocate_that_makes_another_numpy_dtype_keeps_each_call_its_own() -> None:
    setup = Setup(numpy=True)
    arrays.empty(1, np.int16)
    setup.dtypes[np.int16] = arrays.DTYPES[np.int16]
    inner: list[Any] = []
    nested = [True]

    class Nested(RecordingResource):
        def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
            if nested.pop() if nested else False:
                inner.append(setup.entry(8, np.int16))
            return super().allocate(nbytes, alignment, stream)

    setup.resource = Nested()
    setup.defaults["_default"] = setup.resource
    array = setup.entry(16, np.float32)
    assert array.dtype == np.float32 and array.shape == (16,)
    assert inner[0].dtype == np.int16 and inner[0].shape == (8,)
    assert sorted(setup.allocated().values()) == [16, 64]
    del array, inner[:]
    assert setup.allocated() == {}


# --- failures leave nothing allocated ----------------------------------------------------------


def test_an_allocate_that_raises_propagates_and_nothing_is_taken() -> None:
    class Full(RecordingResource):
        def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
            raise MemoryError("full")

    setup = Setup(Full())
    with pytest.raises(MemoryError, match="full"):
        setup.entry(16, np.float32, like="torch")
    assert setup.resource.freed == []


@pytest.mark.parametrize(
    ("address", "error"), [("0x10", TypeError), (-4096, ValueError), (0, ValueError)]
)
def test_a_bad_address_from_allocate_is_refused_and_given_back(address: Any, error: type) -> None:
    class Odd(RecordingResource):
        def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> Any:
            return address

        def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
            self.freed.append((address, nbytes))

    setup = Setup(Odd())
    with pytest.raises(error, match="address"):
        setup.entry(16, np.float32, like="torch")
    assert setup.resource.freed == [(address, 64)]


def test_a_failing_from_dlpack_gives_the_block_back() -> None:
    def refuse(capsule: Any) -> Any:
        raise RuntimeError("from_dlpack failed")

    setup = Setup()
    route = ROUTES[np.float32]
    setup.routes[np.float32] = TorchRoute(np.float32, route.entry, torch, None, FLOAT32, refuse)
    with pytest.raises(RuntimeError, match="from_dlpack failed"):
        setup.entry(16, np.float32, like="torch")
    gc.collect()
    assert setup.allocated() == {} and len(setup.resource.freed) == 1


def test_an_allocate_that_makes_another_dtype_keeps_each_call_its_own_route() -> None:
    """allocate runs Python: a nested call through the entry changes what it remembers."""
    setup = Setup()
    route = ROUTES[np.float32]
    empty(1, np.int16, like="torch")
    setup.routes[np.int16] = ROUTES[np.int16]
    inner: list[Any] = []
    nested = [True]

    class Nested(RecordingResource):
        def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
            if nested.pop() if nested else False:
                inner.append(setup.entry(8, np.int16, like="torch"))
            return super().allocate(nbytes, alignment, stream)

    setup.resource = Nested()
    setup.defaults["_default"] = setup.resource
    tensor = setup.entry(16, np.float32, like="torch")
    assert route.dlpack_dtype == FLOAT32
    assert tensor.dtype == torch.float32 and tensor.shape == (16,)
    assert inner[0].dtype == torch.int16 and inner[0].shape == (8,)
    assert sorted(setup.allocated().values()) == [16, 64]
    del tensor, inner[:]
    assert setup.allocated() == {}


def test_a_patched_allocate_on_the_instance_is_called() -> None:
    setup = Setup()
    seen: list[int] = []
    original = setup.resource.allocate

    def patched(nbytes: int, alignment: int = 256, stream: object = None) -> int:
        seen.append(nbytes)
        return original(nbytes, alignment, stream)

    setup.resource.allocate = patched  # type: ignore[method-assign]
    tensor = setup.entry(16, np.float32, like="torch")
    assert seen == [64] and setup.allocated() == {tensor.data_ptr(): 64}


def test_tensors_made_and_freed_from_threads_all_come_back() -> None:
    host = tensorarena.HostMemory()
    cached = tensorarena.ThreadCached(host)
    setup = Setup(cached)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for n in range(1, 300):
                tensor = setup.entry(n, np.float32, like="torch")
                tensor.fill_(1.0)
                assert float(tensor.sum()) == n
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    cached.flush_all()
    assert host.live_blocks() == {}
    assert host.statistics().allocations.total > 0


# --- the object itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        (1, {}, contextvars.ContextVar("s"), {}, 256, 1),  # general not callable
        (print, [], contextvars.ContextVar("s"), {}, 256, 1),  # routes not a dict
        (print, {}, object(), {}, 256, 1),  # not a ContextVar
        (print, {}, contextvars.ContextVar("s"), {}, "256", 1),
        (print, {}, contextvars.ContextVar("s"), {}, 256, 0),
    ],
    ids=["general", "routes", "scope-var", "alignment", "max-size"],
)
def test_bad_construction_arguments_are_refused(arguments: tuple[Any, ...]) -> None:
    with pytest.raises(TypeError):
        native_empty.FastEmpty(*arguments)


def test_an_entry_is_collected_with_a_cycle_through_its_dict() -> None:
    setup = Setup()
    entry = setup.entry
    entry.itself = entry  # a cycle through __dict__
    reference = weakref.ref(entry)
    del setup, entry
    gc.collect()
    assert reference() is None
