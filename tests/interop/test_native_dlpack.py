"""The DLPack route of ``empty(..., like="torch")``: a capsule that takes a block over.

``_native_owner.dlpack(resource, address, nbytes, shape, dtype)`` makes a ``"dltensor"`` capsule
over a block; ``torch._C._from_dlpack`` makes a tensor of it, and the block goes back with one
``deallocate`` when the tensor's storage (or the unconsumed capsule) dies. Every test counts the
frees with a recording resource. Skipped without the C extension (the pure build takes
``torch.frombuffer``, covered by ``test_arrays.py``) or without torch.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
from typing import Any

import numpy as np
import pytest

from _recording import RecordingResource
from tensorarena.interop import empty, scope
from tensorarena.interop._torch_route import LAST_ROUTE, ROUTES, TorchRoute
from tensorarena.interop.owner import native_dlpack

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.skipif(native_dlpack is None, reason="the C extension is not built"),
    pytest.mark.usefixtures("no_unraisable"),
]

NBYTES = 4096
UINT8 = 1 | 8 << 8  # DLPack kDLUInt, 8 bits
FLOAT32 = 2 | 32 << 8  # kDLFloat, 32 bits


def _capsule(resource: RecordingResource, shape: Any, dtype: int = UINT8) -> tuple[Any, int]:
    assert native_dlpack is not None
    address = resource.allocate(NBYTES)
    return native_dlpack(resource, address, NBYTES, shape, dtype), address


# --- the block lives exactly as long as the tensor's storage ---------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype", "expected"),
    [
        (NBYTES, UINT8, (torch.uint8, (NBYTES,), (1,))),
        ((16, 64), FLOAT32, (torch.float32, (16, 64), (64, 1))),
        ((2, 0, 3), FLOAT32, (torch.float32, (2, 0, 3), (3, 3, 1))),
        ((), FLOAT32, (torch.float32, (), ())),
        ((2**40, 0, 2**20), UINT8, (torch.uint8, (2**40, 0, 2**20), (2**20, 2**20, 1))),
    ],
    ids=["1-d", "2-d", "zero-size", "0-d", "large-zero-size"],
)
def test_a_tensor_is_the_block_and_frees_it_once(
    shape: Any, dtype: int, expected: tuple[Any, tuple[int, ...], tuple[int, ...]]
) -> None:
    resource = RecordingResource()
    capsule, address = _capsule(resource, shape, dtype)
    tensor = torch._C._from_dlpack(capsule)
    del capsule  # consumed: dying frees nothing
    assert resource.freed == [] and resource.live() == {address: NBYTES}
    torch_dtype, sizes, strides = expected
    assert (tensor.dtype, tuple(tensor.shape), tensor.stride()) == (torch_dtype, sizes, strides)
    assert tensor.device.type == "cpu" and tensor.is_contiguous()
    if tensor.numel():
        assert tensor.data_ptr() == address
        tensor.view(-1)[-1] = 7  # the last item is inside the block, and written there
        last = address + (tensor.numel() - 1) * tensor.element_size()
        item = np.ctypeslib.as_array((ctypes.c_uint8 * tensor.element_size()).from_address(last))
        assert item.tobytes() == np.array(7).astype(tensor.numpy().dtype).tobytes()
    del tensor
    assert resource.freed == [(address, NBYTES)] and resource.live() == {}


def test_a_view_outliving_its_tensor_keeps_the_block() -> None:
    resource = RecordingResource()
    capsule, address = _capsule(resource, (64, 64))
    tensor = torch._C._from_dlpack(capsule)
    del capsule
    rows = tensor[10:20]
    storage = tensor.untyped_storage()
    del tensor
    gc.collect()
    assert resource.freed == []
    rows.fill_(3)
    del rows
    assert resource.freed == []  # the storage still holds it
    del storage
    assert resource.freed == [(address, NBYTES)]


def test_an_unconsumed_capsule_gives_the_block_back() -> None:
    resource = RecordingResource()
    capsule, address = _capsule(resource, NBYTES)
    del capsule
    assert resource.freed == [(address, NBYTES)] and resource.live() == {}


def test_a_tensor_dying_in_another_thread_frees_its_block_once() -> None:
    resource = RecordingResource()
    tensors = [torch._C._from_dlpack(_capsule(resource, NBYTES)[0]) for _ in range(64)]
    addresses = sorted(tensor.data_ptr() for tensor in tensors)

    def drop() -> None:
        while tensors:
            tensors.pop()

    workers = [threading.Thread(target=drop) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(address for address, _ in resource.freed) == addresses
    assert resource.live() == {}


def test_an_exception_in_deallocate_is_reported_and_a_pending_one_is_kept(
    no_unraisable: list[str],
) -> None:
    class Failing(RecordingResource):
        def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
            super().deallocate(address, nbytes, stream)
            raise RuntimeError("deallocate failed")

    resource = Failing()
    tensor = torch._C._from_dlpack(_capsule(resource, NBYTES)[0])
    del tensor  # reported as "Exception ignored in", not raised here
    assert no_unraisable == [repr(RuntimeError("deallocate failed"))]
    with pytest.raises(IndexError):
        [torch._C._from_dlpack(_capsule(resource, NBYTES)[0])][1]
    assert len(resource.freed) == 2 and len(no_unraisable) == 2
    no_unraisable.clear()  # expected: the fixture fails on any other


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_GET_POINTER = ctypes.pythonapi.PyCapsule_GetPointer
_GET_POINTER.restype, _GET_POINTER.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_SET_NAME = ctypes.pythonapi.PyCapsule_SetName
_SET_NAME.restype, _SET_NAME.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


def _call_deleter(capsule: Any, name: bytes) -> None:
    """What a consumer does with the DLManagedTensor: call its deleter (at byte 56, after the
    48-byte DLTensor and manager_ctx), here without the GIL, as torch may."""
    managed = _GET_POINTER(capsule, name)
    _DELETER(ctypes.c_void_p.from_address(managed + 56).value)(managed)


@pytest.mark.parametrize("renamed", [True, False], ids=["consumed", "failed-consumer"])
def test_a_consumer_calling_the_deleter_frees_the_block_once(renamed: bool) -> None:
    # A consumer that fails half way may call the deleter in its clean-up and leave the capsule
    # unconsumed (torch does for a shape whose item count overflows): still one free, no crash.
    resource = RecordingResource()
    capsule, address = _capsule(resource, NBYTES)
    if renamed:
        assert _SET_NAME(capsule, b"used_dltensor") == 0
    _call_deleter(capsule, b"used_dltensor" if renamed else b"dltensor")
    assert resource.freed == [(address, NBYTES)]
    del capsule
    gc.collect()
    assert resource.freed == [(address, NBYTES)] and resource.live() == {}


def test_a_dtype_torch_refuses_leaves_the_capsule_to_free_the_block() -> None:
    resource = RecordingResource()
    capsule, address = _capsule(resource, 4, 2 | 24 << 8)  # a 24-bit float: torch has none
    with pytest.raises((RuntimeError, BufferError, TypeError)):
        torch._C._from_dlpack(capsule)
    assert resource.freed == []
    del capsule
    assert resource.freed == [(address, NBYTES)] and resource.live() == {}


# --- refusals: nothing is taken over, nothing is freed ---------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((NBYTES + 1,), ValueError, "needs more than the block's 4096 bytes"),
        (((64, 65),), ValueError, "needs more than the block's"),
        (((1025,), FLOAT32), ValueError, "32-bit items needs more than"),
        (((2**62, 2**62),), ValueError, "overflows 64 bits"),
        # Zero items, but torch overflows multiplying the others (and so would the strides).
        (((2**40, 2**40, 0),), ValueError, "overflows 64 bits"),
        (((0, 2**40, 2**40),), ValueError, "overflows 64 bits"),
        (((2**61,), FLOAT32), ValueError, "overflows 64 bits"),
        ((-1,), ValueError, "dimension -1 is not in"),
        ((2**63,), ValueError, "is not in \\[0, 2\\*\\*63\\)"),
        ((4.0,), TypeError, "shape must be an int or a tuple, not float"),
        (([4],), TypeError, "shape must be an int or a tuple, not list"),
        (((4, "4"),), TypeError, "a dimension must be an int, not str"),
        (((True,),), TypeError, "a dimension must be an int, not bool"),
        (((1,) * 65,), ValueError, "65 dimensions, over 64"),
        ((4, 1 | 12 << 8), ValueError, "bits a multiple of 8"),
        ((4, 1), ValueError, "bits a multiple of 8"),
        ((4, -1), ValueError, "code \\| bits << 8"),
        ((4, 2.0), ValueError, "code \\| bits << 8"),
    ],
)
def test_bad_shapes_and_dtypes_are_refused_and_nothing_is_freed(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    assert native_dlpack is not None
    resource = RecordingResource()
    address = resource.allocate(NBYTES)
    shape, dtype = (args[0], args[1]) if len(args) == 2 else (args[0], UINT8)
    references = sys.getrefcount(resource)
    with pytest.raises(error, match=match):
        native_dlpack(resource, address, NBYTES, shape, dtype)
    gc.collect()
    assert resource.freed == [] and sys.getrefcount(resource) == references
    resource.deallocate(address, NBYTES)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, NBYTES), ValueError, "address must be positive"),
        ((4096, 0), ValueError, "nbytes must be positive"),
        ((4096.0, NBYTES), TypeError, "dlpack\\(\\): address must be an int, not float"),
        ((2**62, 2**62), ValueError, "runs past the address space"),
    ],
)
def test_bad_blocks_are_refused(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    assert native_dlpack is not None
    resource = RecordingResource()
    with pytest.raises(error, match=match):
        native_dlpack(resource, *args, 1, UINT8)
    with pytest.raises(TypeError, match="takes 5 arguments \\(2 given\\)"):
        native_dlpack(resource, 4096)
    assert resource.freed == []


# --- empty(like="torch") ----------------------------------------------------------------------


DLPACK_DTYPES = [
    np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
    torch.bfloat16, torch.float32, "float32",
]  # fmt: skip


@pytest.mark.parametrize("dtype", DLPACK_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [12, (3, 4), (2, 3, 2)], ids=["1-d", "2-d", "3-d"])
def test_empty_takes_dlpack_for_the_dtypes_torch_reads_back(dtype: Any, shape: Any) -> None:
    resource = RecordingResource()
    tensor = empty(shape, dtype, resource=resource, like="torch")  # type: ignore[arg-type]
    route = ROUTES[dtype]
    assert route.dlpack_dtype is not None, "the DLPack route"
    if isinstance(dtype, torch.dtype):
        expected = dtype
    else:
        expected = torch.from_numpy(np.empty(0, dtype)).dtype
    assert tensor.dtype == expected
    assert tuple(tensor.shape) == (shape if isinstance(shape, tuple) else (shape,))
    assert tensor.is_contiguous() and resource.live() == {tensor.data_ptr(): tensor.nbytes}
    tensor.fill_(1)
    assert bool((tensor == 1).all())
    del tensor
    assert len(resource.freed) == 1 and resource.live() == {}


def test_dtypes_dlpack_does_not_carry_take_frombuffer() -> None:
    resource = RecordingResource()
    tensor = empty((3, 4), torch.uint16, resource=resource, like="torch")  # type: ignore[arg-type]
    assert tensor.dtype == torch.uint16 and tuple(tensor.shape) == (3, 4)
    assert ROUTES[torch.uint16].dlpack_dtype is None
    del tensor
    assert len(resource.freed) == 1 and resource.live() == {}


def test_a_scope_tracks_its_tensors_through_an_owner() -> None:
    resource = RecordingResource()
    with scope(resource) as current:  # type: ignore[arg-type]
        tensor = empty(16, np.float32, like="torch")
        assert [owner.address for owner in current.live()] == [tensor.data_ptr()]
        del tensor
    assert len(resource.freed) == 1 and resource.live() == {}


def test_a_failing_from_dlpack_leaves_nothing_allocated() -> None:
    def refuse(capsule: Any) -> Any:
        raise RuntimeError("from_dlpack failed")

    empty(1, np.float32, like="torch")
    route = ROUTES[np.float32]
    key = object()  # found through the last-route memo, by identity
    failing = TorchRoute(key, route.entry, torch, route.dtype, route.dlpack_dtype, refuse)
    resource = RecordingResource()
    LAST_ROUTE.route = failing
    try:
        with pytest.raises(RuntimeError, match="from_dlpack failed"):
            empty(16, key, resource=resource, like="torch")  # type: ignore[arg-type]
    finally:
        LAST_ROUTE.route = None
    gc.collect()
    assert len(resource.freed) == 1 and resource.live() == {}
