"""empty/zeros: real bytes from the resource, back to it exactly when the last view dies."""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import itertools
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

import tensorarena
from tensorarena.errors import (
    InvalidAlignmentError,
    InvalidSizeError,
    MissingDependencyError,
    OutOfMemoryError,
)
from tensorarena.interop import (
    Allocation,
    default_resource,
    empty,
    set_default_resource,
    zeros,
)
from tensorarena.interop._torch_route import ROUTES
from tensorarena.memory.host import HostMemory


@pytest.fixture
def host() -> HostMemory:
    """One mapping per array: its live set is exactly the set of living arrays."""
    return HostMemory()


def _pool() -> object:
    from tensorarena.memory.pool import Pool

    return Pool(HostMemory(), initial_size="4MiB")


def test_array_bytes_are_the_resources_bytes(host: HostMemory) -> None:
    array = empty((4, 5), np.int32, resource=host)
    assert isinstance(array, np.ndarray) and array.shape == (4, 5) and array.dtype == np.int32
    assert array.flags.c_contiguous and array.flags.writeable
    address = array.ctypes.data
    assert host.live_blocks() == {address: 80}
    array[...] = np.arange(20, dtype=np.int32).reshape(4, 5)
    raw = ctypes.string_at(address, 80)
    assert np.frombuffer(raw, np.int32).tolist() == list(range(20))
    ctypes.memmove(address, np.full(20, 7, np.int32).tobytes(), 80)
    assert (array == 7).all()
    assert isinstance(array.base, Allocation) and array.base.address == address


def test_memory_returns_exactly_when_the_last_view_dies(host: HostMemory) -> None:
    array = empty((100, 100), np.float64, resource=host)
    address = array.ctypes.data
    row = array[3]
    transposed = array.T
    reshaped = array.reshape(25, 400)
    del array
    gc.collect()
    assert address in host.live_blocks(), "a view is alive: the bytes must stay"
    del row, transposed
    assert address in host.live_blocks()
    reshaped[0, 0] = 1.5  # still valid memory
    del reshaped
    assert host.live_blocks() == {}, "the last view died: the bytes must be back"


def test_two_live_arrays_never_share_bytes() -> None:
    pool = _pool()
    rng = random.Random(42)
    arrays = []
    for i in range(60):
        shape = tuple(rng.randrange(1, 40) for _ in range(rng.randrange(1, 4)))
        dtype = rng.choice([np.uint8, np.int16, np.float32, np.float64, np.complex128])
        array = empty(shape, dtype, resource=pool)  # type: ignore[arg-type]
        array.view(np.uint8)[...] = i
        arrays.append(array)
        if rng.random() < 0.3:
            arrays.pop(rng.randrange(len(arrays)))  # frees: its bytes may be reused
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    for array in arrays:
        values = array.view(np.uint8)
        assert (values == values.flat[0]).all(), "another array wrote into this one"
    del arrays, array, values
    assert pool.statistics().allocations.current == 0  # type: ignore[attr-defined]


def test_zeros_clears_reused_memory() -> None:
    pool = _pool()
    dirty = empty(1000, np.uint8, resource=pool)  # type: ignore[arg-type]
    dirty[...] = 0xFF
    address = dirty.ctypes.data
    del dirty
    clean = zeros(1000, np.uint8, resource=pool)  # type: ignore[arg-type]
    assert clean.ctypes.data == address, "the pool should hand the same block back"
    assert not clean.any()


@pytest.mark.parametrize(
    ("shape", "dtype", "expected_shape"),
    [
        (7, np.float32, (7,)),
        ((2, 3, 4), "float64", (2, 3, 4)),
        ([3, 2], np.int8, (3, 2)),
        ((np.int64(3), np.int32(2)), np.uint16, (3, 2)),
        (np.int64(5), np.float32, (5,)),
        (np.uint8(3), np.int16, (3,)),
        ((), np.complex64, ()),
        ((0, 5), np.float32, (0, 5)),
        (4, np.dtype([("id", "<i4"), ("score", "<f8")]), (4,)),
        (3, "S5", (3,)),
        (2, ">i8", (2,)),
    ],
)
def test_shapes_and_dtypes(
    host: HostMemory, shape: object, dtype: object, expected_shape: tuple[int, ...]
) -> None:
    array = zeros(shape, dtype, resource=host)  # type: ignore[arg-type]
    assert array.shape == expected_shape and array.dtype == np.dtype(dtype)  # type: ignore[call-overload]
    assert array.nbytes == np.zeros(expected_shape, dtype).nbytes  # type: ignore[call-overload]
    assert ctypes.string_at(array.ctypes.data, array.nbytes) == bytes(array.nbytes)
    assert len(host.live_blocks()) == 1
    del array
    assert host.live_blocks() == {}


def test_alignment(host: HostMemory) -> None:
    array = empty(10, np.float32, resource=host, alignment=1 << 16)
    assert array.ctypes.data % (1 << 16) == 0
    pooled = empty(10, np.float32, resource=_pool(), alignment=4096)  # type: ignore[arg-type]
    assert pooled.ctypes.data % 4096 == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"shape": -1}, InvalidSizeError),
        ({"shape": (2, -3)}, InvalidSizeError),
        ({"shape": 1.5}, InvalidSizeError),
        ({"shape": (2, 2.0)}, InvalidSizeError),
        ({"shape": (True, 2)}, InvalidSizeError),
        ({"shape": "12"}, InvalidSizeError),
        ({"shape": None}, InvalidSizeError),
        ({"shape": np.float64(4)}, InvalidSizeError),
        ({"shape": np.int64(-1)}, InvalidSizeError),
        ({"shape": (2**31, 2**31, 0)}, InvalidSizeError),  # zero items, but NumPy refuses it
        ({"shape": (0, 2**62, 2**62)}, InvalidSizeError),
        ({"shape": 4, "dtype": object}, TypeError),
        ({"shape": 4, "dtype": "S"}, TypeError),
        ({"shape": 4, "dtype": np.dtype((np.float32, 3))}, TypeError),
        ({"shape": 4, "dtype": "not-a-dtype"}, TypeError),
        ({"shape": 4, "like": "cupy"}, ValueError),
        ({"shape": 4, "alignment": 3}, InvalidAlignmentError),
        ({"shape": 4, "alignment": 0}, InvalidAlignmentError),
    ],
)
def test_bad_input_raises_and_allocates_nothing(
    host: HostMemory, kwargs: dict[str, object], error: type[Exception]
) -> None:
    before = host.statistics()
    with pytest.raises(error):
        empty(resource=host, **kwargs)  # type: ignore[arg-type]
    assert host.statistics() == before


def test_resource_exhaustion_leaks_nothing() -> None:
    from tensorarena.memory.growth import Fixed
    from tensorarena.memory.pool import Pool

    pool = Pool(HostMemory(), initial_size="1MiB", growth=Fixed())
    keep = empty(256 * 1024, np.uint8, resource=pool)  # type: ignore[arg-type]
    before = pool.statistics()
    with pytest.raises(OutOfMemoryError):
        empty(1024 * 1024, np.uint8, resource=pool)  # type: ignore[arg-type]
    assert pool.statistics() == dataclasses.replace(before, num_ooms=before.num_ooms + 1)
    del keep


def test_default_resource_is_lazy_shared_and_replaceable(host: HostMemory) -> None:
    first = default_resource()
    assert default_resource() is first
    array = empty(16)
    assert array.base.resource is first
    previous = set_default_resource(host)
    try:
        assert previous is first
        moved = empty(16)
        assert moved.base.resource is host and len(host.live_blocks()) == 1
        del moved
        assert host.live_blocks() == {}
        assert array.base.resource is first, "arrays keep the resource they came from"
    finally:
        set_default_resource(previous)
    with pytest.raises(TypeError):
        set_default_resource(object())  # type: ignore[arg-type]
    assert default_resource() is first


def test_default_resource_is_created_once_under_threads() -> None:
    previous = set_default_resource(None)
    seen: list[object] = []
    barrier = threading.Barrier(8)

    def grab() -> None:
        barrier.wait()
        seen.append(default_resource())

    threads = [threading.Thread(target=grab) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len({id(resource) for resource in seen}) == 1
    finally:
        set_default_resource(previous)


def test_arrays_cross_threads_safely() -> None:
    made: list[np.ndarray] = []  # type: ignore[type-arg]
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(200):
                array = empty(100 + i, np.int64)
                array[...] = seed
                assert (array == seed).all()
                if i % 10 == 0:
                    made.append(array)  # freed later, by another thread
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(made) == 80
    made.clear()


def test_top_level_exports() -> None:
    assert tensorarena.interop.empty is empty
    assert tensorarena.interop.default_resource is default_resource


def test_importing_tensorarena_needs_no_torch_and_maps_nothing() -> None:
    code = (
        "import sys, tensorarena, tensorarena.interop as i; "
        "print('torch' in sys.modules, i.default._default is None)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "True"]


# --- torch ------------------------------------------------------------------------------------


def test_torch_tensor_shares_the_bytes(host: HostMemory) -> None:
    torch = pytest.importorskip("torch")
    tensor = empty((3, 4), resource=host, like="torch")
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    assert tensor.shape == (3, 4) and tensor.device.type == "cpu"
    address = tensor.data_ptr()
    assert host.live_blocks() == {address: 48}
    tensor.fill_(2.5)
    assert np.frombuffer(ctypes.string_at(address, 48), np.float32).tolist() == [2.5] * 12
    array = tensor.numpy()  # numpy view of the same bytes
    array[0, 0] = -1.0
    assert tensor[0, 0].item() == -1.0
    del tensor
    assert address in host.live_blocks(), "the numpy view still holds the bytes"
    del array
    assert host.live_blocks() == {}


def test_numpy_array_and_torch_tensor_of_it_share_bytes(host: HostMemory) -> None:
    torch = pytest.importorskip("torch")
    array = zeros(8, np.int64, resource=host)
    tensor = torch.from_numpy(array)
    tensor += 5
    assert array.tolist() == [5] * 8
    address = array.ctypes.data
    del array
    assert address in host.live_blocks(), "the tensor keeps the array, hence the bytes"
    del tensor
    assert host.live_blocks() == {}


def test_torch_dtypes_including_bfloat16(host: HostMemory) -> None:
    torch = pytest.importorskip("torch")
    tensor = zeros((2, 8), torch.bfloat16, resource=host, like="torch")
    assert tensor.dtype == torch.bfloat16 and tensor.shape == (2, 8)
    assert host.live_blocks() == {tensor.data_ptr(): 32}
    tensor += 1.5
    assert tensor.float().sum().item() == 24.0
    halves = empty(5, torch.float16, resource=host, like="torch")
    assert halves.dtype == torch.float16
    with pytest.raises(TypeError, match="like='torch'"):
        empty(5, torch.float16, resource=host)
    del tensor, halves
    assert host.live_blocks() == {}


def test_missing_torch_names_the_extra(host: HostMemory, monkeypatch: pytest.MonkeyPatch) -> None:
    # A process without torch has never worked out a tensor route: forget the cached ones.
    routes = dict(ROUTES)
    ROUTES.clear()
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    try:
        with pytest.raises(MissingDependencyError, match=r"tensorarena\[torch\]"):
            empty(4, resource=host, like="torch")
    finally:
        ROUTES.update(routes)
    assert host.statistics().allocations.total == 0, "torch is checked before any allocation"
