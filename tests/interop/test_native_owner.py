"""The native (C) block owner: the block lives while anything uses it and goes back exactly once.

Every test counts deallocations with a recording resource, so an early, late, lost or second
free shows up as a difference in ``freed``. The module is skipped where the C extension is not
built (the pure build, which ``tests/interop/test_owner.py`` covers with the ctypes owner).
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import pickle
import weakref
from typing import Any

import numpy as np
import pytest

from _recording import RecordingResource
from tensorarena.interop import Allocation, empty, scope
from tensorarena.interop.owner import NativeAllocation, native_owner
from tensorarena.interop.scope import ScopeEscapeError

pytestmark = [
    pytest.mark.skipif(NativeAllocation is None, reason="the native owner is not built"),
    pytest.mark.usefixtures("no_unraisable"),
]

NBYTES = 64 << 10


_Recording = RecordingResource


def _new(resource: Any, nbytes: int = NBYTES) -> Any:
    """A native owner of a fresh block of ``resource``."""
    assert native_owner is not None
    return native_owner(resource, resource.allocate(nbytes), nbytes)


# --- the block lives exactly as long as something uses it -----------------------------------


def test_an_array_gets_a_native_owner_over_exactly_its_block() -> None:
    resource = _Recording()
    array = empty((16, 1024), np.float32, resource=resource)  # type: ignore[arg-type]
    owner = array.base
    assert type(owner) is NativeAllocation and isinstance(owner, Allocation)
    assert owner.resource is resource and owner.nbytes == NBYTES
    assert owner.address == array.ctypes.data and resource.live() == {owner.address: NBYTES}
    view = memoryview(owner)
    assert view.nbytes == NBYTES and not view.readonly and view.format == "B"
    view[NBYTES - 1] = 0xAB  # writable, through the last byte
    assert array.view(np.uint8)[-1, -1] == 0xAB
    assert gc.is_tracked(owner)
    del array, owner, view
    assert resource.freed and resource.live() == {}


@pytest.mark.parametrize(
    "outlive",
    [
        pytest.param(lambda a: memoryview(a), id="memoryview of the array"),
        pytest.param(lambda a: memoryview(a.base), id="memoryview of the owner"),
        pytest.param(lambda a: a[10:].view(np.int16), id="numpy view"),
        pytest.param(lambda a: np.frombuffer(a, np.uint8), id="frombuffer of the array"),
    ],
)
def test_anything_over_the_bytes_keeps_the_block(outlive: Any) -> None:
    resource = _Recording()
    array = empty(NBYTES // 4, np.float32, resource=resource)  # type: ignore[arg-type]
    address = array.ctypes.data
    array[:] = 5.0
    kept = outlive(array)
    del array
    gc.collect()
    assert resource.freed == [] and resource.live() == {address: NBYTES}
    assert (np.asarray(kept).view(np.uint8)[-8:].view(np.float32) == 5.0).all()
    del kept
    assert resource.freed == [(address, NBYTES)]  # once, as the last user died


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.parametrize("shape", [(NBYTES // 4,), (64, NBYTES // 256)], ids=["1-d", "2-d"])
def test_a_tensor_keeps_the_block_after_its_array_and_its_tensor_views(
    shape: tuple[int, ...],
) -> None:
    import torch

    resource = _Recording()
    array = empty(shape, np.float32, resource=resource)  # type: ignore[arg-type]
    from_array = torch.from_numpy(array)
    tensor = empty(shape, np.float32, resource=resource, like="torch")  # type: ignore[arg-type]
    tensor.fill_(3.0)
    storage = tensor.untyped_storage()
    addresses = {array.ctypes.data, tensor.data_ptr()}
    del array, tensor
    gc.collect()
    assert resource.freed == [] and set(resource.live()) == addresses
    from_array.fill_(2.0)  # both blocks still hold what was written, and take writes
    assert float(from_array.sum()) == 2.0 * (NBYTES // 4)
    assert float(torch.tensor([], dtype=torch.float32).set_(storage).sum()) == 3.0 * (NBYTES // 4)
    del from_array
    assert [address for address, _ in resource.freed] == [min(addresses - {storage.data_ptr()})]
    del storage
    assert sorted(resource.freed) == sorted((address, NBYTES) for address in addresses)


# --- freed exactly once, whatever the path ---------------------------------------------------


def test_a_reference_cycle_through_the_resource_is_freed_once_by_the_collector() -> None:
    resource = _Recording()
    owner = _new(resource)
    address, freed, host = owner.address, resource.freed, resource.host
    resource.keep = owner  # type: ignore[attr-defined]  # owner -> resource -> owner
    owner_ref = weakref.ref(owner)
    del owner, resource
    assert freed == [] and owner_ref() is not None  # reference counting cannot free a cycle
    gc.collect()
    assert freed == [(address, NBYTES)] and owner_ref() is None
    gc.collect()
    assert freed == [(address, NBYTES)] and host.live_blocks() == {}


def test_an_owner_resurrected_by_deallocate_frees_nothing_again() -> None:
    class Resurrecting(_Recording):
        owner_ref: Any = None
        resurrected: Any = None

        def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
            super().deallocate(address, nbytes, stream)
            self.resurrected = self.owner_ref()  # the owner being finalized, alive again

    resource = Resurrecting()
    owner = _new(resource)
    resource.owner_ref = weakref.ref(owner)
    address = owner.address
    del owner
    again = resource.resurrected
    assert type(again) is NativeAllocation and resource.freed == [(address, NBYTES)]
    with pytest.raises(BufferError, match="already given back"):
        memoryview(again)  # its bytes are the resource's again: no new view over them
    with pytest.raises(AttributeError, match="already given back"):
        again.resource  # noqa: B018
    resource.resurrected = None
    del again
    gc.collect()
    assert resource.freed == [(address, NBYTES)]


def test_an_exception_in_deallocate_is_reported_and_a_pending_one_is_kept(
    no_unraisable: list[str],
) -> None:
    class Failing(_Recording):
        def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
            super().deallocate(address, nbytes, stream)
            raise RuntimeError("deallocate failed")

    resource = Failing()
    owner = _new(resource)
    del owner  # reported as "Exception ignored in", not raised here
    assert no_unraisable == [repr(RuntimeError("deallocate failed"))]
    assert len(resource.freed) == 1
    # The list and the owner die as the IndexError is raised: deallocate runs with it pending,
    # and both must survive (the IndexError propagates, the RuntimeError is reported).
    with pytest.raises(IndexError):
        [_new(resource)][1]
    assert len(resource.freed) == 2 and len(no_unraisable) == 2
    no_unraisable.clear()  # expected: the fixture fails on any other


def test_a_pending_exception_survives_a_successful_deallocate() -> None:
    resource = _Recording()
    with pytest.raises(IndexError, match="list index out of range"):
        [_new(resource)][1]
    assert len(resource.freed) == 1 and resource.live() == {}


# --- construction, copies, scopes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((4096,), TypeError, "takes 3 arguments"),
        ((1, 4096, 1, 1), TypeError, "takes 3 arguments"),
        ((0, 4096), ValueError, "address must be positive"),
        ((-8, 4096), ValueError, "address must be positive"),
        ((2**64, 4096), ValueError, "address must be positive and below 2\\*\\*63"),
        ((4096, 0), ValueError, "nbytes must be positive"),
        ((4096, -1), ValueError, "nbytes must be positive"),
        ((4096.0, 4096), TypeError, "address must be an int, not float"),
        ((True, 4096), TypeError, "address must be an int, not bool"),
        ((np.int64(4096), 4096), TypeError, "address must be an int"),
        ((4096, "4096"), TypeError, "nbytes must be an int, not str"),
        ((2**62, 2**62), ValueError, "runs past the address space"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    resource = _Recording()
    assert native_owner is not None
    with pytest.raises(error, match=match):
        native_owner(resource, *args)
    gc.collect()
    assert resource.freed == []  # no owner was made, so nothing is freed


def test_the_type_cannot_be_called_or_subclassed_or_redefined() -> None:
    from tensorarena.interop import _native_owner

    assert NativeAllocation is not None
    with pytest.raises(TypeError, match="cannot create"):
        NativeAllocation(_Recording(), 4096, 4096)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        type("Sub", (NativeAllocation,), {})
    assert _native_owner.define_type(Allocation) is NativeAllocation  # idempotent
    with pytest.raises(RuntimeError, match="already defined"):
        _native_owner.define_type(type("Other", (), {"__slots__": ()}))  # type: ignore[arg-type]


def test_the_attributes_are_read_only() -> None:
    resource = _Recording()
    owner = _new(resource)
    for name, value in (("address", 8), ("nbytes", 8), ("resource", None)):
        with pytest.raises(AttributeError):
            setattr(owner, name, value)
    with pytest.raises(AttributeError):
        owner.anything_else = 1
    del owner
    assert len(resource.freed) == 1


def test_an_owner_cannot_be_copied_or_pickled() -> None:
    resource = _Recording()
    owner = _new(resource)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied"):
            duplicate(owner)
    del owner
    assert len(resource.freed) == 1


def test_a_scope_tracks_native_owners_weakly() -> None:
    resource = _Recording()
    with scope(resource) as current:  # type: ignore[arg-type]
        dropped = empty(NBYTES, np.uint8)
        assert [type(owner) for owner in current.live()] == [NativeAllocation]
        del dropped
        assert current.live() == []  # a weak reference: the scope kept nothing alive
        assert len(resource.freed) == 1
    with pytest.raises(ScopeEscapeError), scope(resource):  # type: ignore[arg-type]
        kept = empty(NBYTES, np.uint8)
    assert weakref.ref(kept.base)() is kept.base
    del kept
    assert len(resource.freed) == 2 and resource.live() == {}
