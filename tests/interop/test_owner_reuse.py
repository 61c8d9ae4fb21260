"""The owner under the most eager reuse there is: a thread cache, which hands the last block freed
straight back (LIFO), in front of the compiled ``empty`` path.

Every test proves that the reuse is real (a block freed is the next one handed out), then that
an array's block is neither handed out again nor returned while any view of it lives, and that
it is returned exactly once, after the last one dies. Freed blocks are recorded by a resource
that wraps the cache, so an early or a second free shows up as an address in the record.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tensorarena.adaptors import ThreadCached
from tensorarena.interop import empty
from tensorarena.interop.owner import InterfaceAllocation
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory_kind import MemoryKind

pytestmark = pytest.mark.usefixtures("no_unraisable")

NBYTES = 3 * 4096 + 192  # a byte count of its own: its owner type is made by the warm-up below


class _Recording:
    """A host resource over a ``ThreadCached`` pool that records every address freed."""

    memory_kind = MemoryKind.HOST

    def __init__(self) -> None:
        self.cached = ThreadCached(Pool(HostMemory()))
        self.freed: list[int] = []

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        return self.cached.allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.freed.append(address)
        self.cached.deallocate(address, nbytes, stream)


@pytest.fixture
def resource() -> _Recording:
    recording = _Recording()
    for _ in range(2):  # the second array of a byte count makes its ctypes owner type
        empty(NBYTES, np.uint8, resource=recording)
    recording.freed.clear()
    return recording


def _address(array: Any) -> int:
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return int(array.untyped_storage().data_ptr())


def _check_lifo(resource: _Recording, like: str) -> None:
    """The cache hands the block freed last straight back: an early free would be reused."""
    first = empty(NBYTES, np.uint8, resource=resource, like=like)
    address = _address(first)
    del first
    assert resource.freed == [address]
    second = empty(NBYTES, np.uint8, resource=resource, like=like)
    assert _address(second) == address
    del second
    resource.freed.clear()


NUMPY_VIEWS: dict[str, Callable[[np.ndarray], Any]] = {
    "slice": lambda array: array[16:],
    "strided": lambda array: array[::2],
    "dtype view": lambda array: array.view(np.int16),
    "memoryview": memoryview,
    "frombuffer": lambda array: np.frombuffer(array, np.uint8),
}


@pytest.mark.parametrize("make_view", NUMPY_VIEWS.values(), ids=list(NUMPY_VIEWS))
def test_a_view_keeps_its_block_out_of_the_thread_cache(
    resource: _Recording, make_view: Callable[[np.ndarray], Any]
) -> None:
    _check_lifo(resource, "numpy")
    array = empty(NBYTES, np.uint8, resource=resource)
    assert type(array.base) is not InterfaceAllocation  # the ctypes block owner
    address = _address(array)
    array[:] = 7
    view = make_view(array)
    del array
    assert resource.freed == []  # not while the view lives
    other = empty(NBYTES, np.uint8, resource=resource)
    other_address = _address(other)
    assert other_address != address  # the cache did not hand it out again
    other[:] = 1
    assert set(np.asarray(view).tobytes()) == {7}  # the view's bytes are untouched
    del view
    assert resource.freed == [address]  # once, when the last view died
    again = empty(NBYTES, np.uint8, resource=resource)
    assert _address(again) == address  # and now it is reused
    del other, again
    assert resource.freed == [address, other_address, address]


def test_many_arrays_and_views_never_share_a_live_block(resource: _Recording) -> None:
    kept: list[np.ndarray] = []
    for round_ in range(200):
        array = empty(NBYTES, np.uint8, resource=resource)
        array[:] = round_ % 251
        if round_ % 3 == 0:
            kept.append(array[5:])  # a view outlives its array
        del array
    starts = [_address(view) - 5 for view in kept]
    assert len(set(starts)) == len(kept)
    for round_, view in zip(range(0, 200, 3), kept, strict=True):
        assert (view == round_ % 251).all()
    del view
    freed_before = len(resource.freed)
    kept.clear()
    assert sorted(resource.freed[freed_before:]) == sorted(starts)  # each once, only now
    assert len(resource.freed) == 200 and resource.cached.statistics().live_blocks == 0


TORCH_VIEWS: dict[str, Callable[[Any], Any]] = {
    "slice": lambda tensor: tensor[16:],
    "reshape": lambda tensor: tensor.view(-1, 64),
    "numpy": lambda tensor: tensor.numpy(),
    "storage": lambda tensor: tensor.untyped_storage(),
}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
@pytest.mark.parametrize("view_name", list(TORCH_VIEWS))
def test_a_tensor_view_keeps_its_block_out_of_the_thread_cache(
    resource: _Recording, view_name: str
) -> None:
    import torch

    _check_lifo(resource, "torch")
    tensor = empty(NBYTES, np.uint8, resource=resource, like="torch")
    address = _address(tensor)
    tensor.fill_(9)
    view: Any = TORCH_VIEWS[view_name](tensor)
    del tensor
    assert resource.freed == []
    other = empty(NBYTES, np.uint8, resource=resource, like="torch")
    other_address = _address(other)
    assert other_address != address
    other.fill_(1)
    if view_name == "storage":
        view = torch.tensor([], dtype=torch.uint8).set_(view)
    assert set(torch.as_tensor(view).flatten().tolist()) == {9}
    del view
    assert resource.freed == [address]
    del other
    assert resource.freed == [address, other_address]
