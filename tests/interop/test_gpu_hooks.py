"""The CuPy, Numba and PyTorch hooks on the CPU: fakes of the libraries' classes with the real
ones' signatures, and the real compiled shim called through ctypes as PyTorch would call it."""

from __future__ import annotations

import collections
import ctypes
import gc
import types
import weakref
from pathlib import Path
from typing import Any

import pytest
from _shim_calls import c_calls

from tensorarena.adaptors import Limiting
from tensorarena.errors import (
    InvalidArgumentError,
    InvalidResourceError,
    OutOfMemoryError,
    ShimUnavailableError,
    TensorArenaError,
)
from tensorarena.interop.cupy_allocator import CupyAllocator, CupyPinnedAllocator, use_with_cupy
from tensorarena.interop.device_arrays import device_of
from tensorarena.interop.numba_emm import memory_manager_class, use_with_numba
from tensorarena.interop.torch_allocator import TorchAllocator, build_shim, find_shim
from tensorarena.memory import HostMemory, Pool
from tensorarena.memory.cuda import CudaMemory, CudaRuntime

# --- CuPy ---------------------------------------------------------------------------------------


def fake_cupy() -> Any:
    """CuPy's allocator-facing classes, with the attributes our hook uses."""

    class UnownedMemory:
        def __init__(self, ptr: int, size: int, owner: object, device_id: int = -1) -> None:
            self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id

    class MemoryPointer:
        def __init__(self, mem: Any, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    class PinnedMemoryPointer:
        def __init__(self, mem: Any, offset: int) -> None:
            self.mem, self.ptr = mem, mem.ptr + offset

    state: dict[str, Any] = {"allocator": "cupy-pool", "pinned": None}
    cuda = types.SimpleNamespace(
        UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer,
        PinnedMemoryPointer=PinnedMemoryPointer,
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x70),
        Device=lambda: types.SimpleNamespace(id=0),
        get_allocator=lambda: state["allocator"],
        set_allocator=lambda a: state.__setitem__("allocator", a),
        set_pinned_memory_allocator=lambda a: state.__setitem__("pinned", a),
    )
    pool = types.SimpleNamespace(malloc="cupy-pinned-pool")
    return types.SimpleNamespace(cuda=cuda, state=state,
                                 get_default_pinned_memory_pool=lambda: pool)


class Recording:
    """Wraps a resource, recording the stream of every call."""

    def __init__(self, upstream: Any) -> None:
        self.upstream = upstream
        self.memory_kind = upstream.memory_kind
        self.calls: list[tuple[str, int, object]] = []

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        address: int = self.upstream.allocate(nbytes, alignment, stream)
        self.calls.append(("allocate", nbytes, stream))
        return address

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.upstream.deallocate(address, nbytes, stream)
        self.calls.append(("deallocate", nbytes, stream))


def test_cupy_gets_blocks_that_come_back_when_its_memory_dies() -> None:
    from tensorarena.testing.cuda import Simulator

    fake = Simulator()
    resource = Recording(Pool(CudaMemory(1, runtime=CudaRuntime(fake))))
    allocator = CupyAllocator(resource, cupy=fake_cupy())
    pointer = allocator(1000)
    assert pointer.mem.size == 1000 and pointer.mem.device_id == 1
    assert resource.calls == [("allocate", 1000, 0x70)], "on CuPy's current stream"
    assert allocator(0).mem.size == 1, "a zero-byte request still gets an address"
    del pointer
    gc.collect()
    assert ("deallocate", 1000, 0x70) in resource.calls
    assert resource.upstream.statistics().allocations.current == 0
    fake.close()


def test_cupy_allocations_do_not_walk_the_resource_stack_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The device of a given resource is found once, when the allocator is made: its layers
    cannot change, and walking them cost every CuPy allocation."""
    from tensorarena.interop import cupy_allocator
    from tensorarena.testing.cuda import Simulator

    walks: list[object] = []

    def counted(resource: object) -> int | None:
        walks.append(resource)
        return device_of(resource)

    monkeypatch.setattr(cupy_allocator, "device_of", counted)
    fake = Simulator()
    resource = Recording(Pool(CudaMemory(1, runtime=CudaRuntime(fake))))
    allocator = CupyAllocator(resource, cupy=fake_cupy())
    pointers = [allocator(256) for _ in range(3)]
    assert [p.mem.device_id for p in pointers] == [1, 1, 1]
    assert walks == [resource]
    del pointers
    gc.collect()
    assert resource.upstream.statistics().allocations.current == 0
    fake.close()


def test_cupy_pinned_allocator_and_use_with_cupy_restores() -> None:
    cupy = fake_cupy()
    pinned = Pool(HostMemory())
    pointer = CupyPinnedAllocator(pinned, cupy=cupy)(4096)
    ctypes.memset(pointer.ptr, 1, 4096)
    assert pinned.statistics().allocations.current == 1
    del pointer
    gc.collect()
    assert pinned.statistics().allocations.current == 0
    with use_with_cupy(Pool(HostMemory()), pinned=pinned, cupy=cupy) as allocator:
        assert cupy.state["allocator"] is allocator
        assert isinstance(cupy.state["pinned"], CupyPinnedAllocator)
    assert cupy.state == {"allocator": "cupy-pool", "pinned": "cupy-pinned-pool"}
    with use_with_cupy(Pool(HostMemory()), pinned=False, cupy=cupy):
        assert cupy.state["pinned"] == "cupy-pinned-pool"



@pytest.mark.parametrize("resource", [3, "device", HostMemory], ids=repr)
def test_a_cupy_hook_over_what_is_not_a_resource_is_refused_when_made(resource: object) -> None:
    # Accepted, and CuPy's first allocation through it raised AttributeError (or called the
    # unbound HostMemory.allocate); use_with_cupy had already swapped CuPy's allocators.
    cupy = fake_cupy()
    before = dict(cupy.state)
    for hook in (CupyAllocator, CupyPinnedAllocator):
        with pytest.raises(InvalidResourceError):
            hook(resource, cupy=cupy)  # type: ignore[arg-type]
    with pytest.raises(InvalidResourceError), use_with_cupy(resource, cupy=cupy):  # type: ignore[arg-type]
        pass
    assert cupy.state == before


# --- Numba --------------------------------------------------------------------------------------


def fake_numba_cuda() -> Any:
    """numba.cuda's EMM-facing classes (NBEP 7 signatures)."""

    class HostOnlyCUDAMemoryManager:
        def __init__(self, context: Any) -> None:
            self.context = context

        def reset(self) -> None:
            pass

    class MemoryPointer:
        def __init__(self, context: Any, pointer: Any, size: int, owner: Any = None,
                     finalizer: Any = None) -> None:
            self.context, self.device_pointer, self.size = context, pointer, size
            if finalizer is not None:
                self._finalizer = weakref.finalize(self, finalizer)

    installed: list[type] = []
    return types.SimpleNamespace(
        HostOnlyCUDAMemoryManager=HostOnlyCUDAMemoryManager,
        MemoryPointer=MemoryPointer,
        MemoryInfo=collections.namedtuple("MemoryInfo", "free total"),
        set_memory_manager=installed.append,
        installed=installed,
    )


def test_a_numba_factory_that_cannot_make_a_resource_is_refused() -> None:
    # use_with_numba(3) installed the plugin and Numba's first allocation raised TypeError;
    # a factory that returned no resource failed with AttributeError in memalloc.
    numba_cuda = fake_numba_cuda()
    with pytest.raises(InvalidArgumentError, match="factory must be a callable"):
        use_with_numba(3, numba_cuda=numba_cuda)  # type: ignore[arg-type]
    assert numba_cuda.installed == []
    manager_class = use_with_numba(lambda device: "pool", numba_cuda=numba_cuda)  # type: ignore[arg-type,return-value]
    manager = manager_class(types.SimpleNamespace(device=types.SimpleNamespace(id=0)))
    with pytest.raises(InvalidResourceError, match="factory"):
        manager.memalloc(64)


def test_numba_plugin_allocates_per_device_and_frees_through_the_finalizer() -> None:
    from tensorarena.testing.cuda import Simulator

    fake = Simulator(memory=1 << 26)
    runtime = CudaRuntime(fake)
    made: dict[int, Any] = {}

    def factory(device: int) -> Pool:
        made[device] = Pool(CudaMemory(device, runtime=runtime))
        return made[device]

    numba_cuda = fake_numba_cuda()
    manager_class = use_with_numba(factory, numba_cuda=numba_cuda)
    assert numba_cuda.installed == [manager_class]
    context = types.SimpleNamespace(device=types.SimpleNamespace(id=1))
    manager = manager_class(context)
    assert manager.interface_version == 1
    pointer = manager.memalloc(4096)
    assert list(made) == [1] and pointer.size == 4096
    assert int(getattr(pointer.device_pointer, "value", pointer.device_pointer)) in (
        made[1].live_blocks()
    )
    info = manager.get_memory_info()
    assert info.total == 1 << 26 and 0 < info.free < info.total
    with pytest.raises(TensorArenaError, match="IPC"):
        manager.get_ipc_handle(pointer)
    del pointer
    gc.collect()
    assert made[1].live_blocks() == {}
    fake.close()


def test_numba_plugin_over_a_resource_without_memory_info_asks_the_runtime() -> None:
    from tensorarena.memory.cuda import set_cuda_runtime
    from tensorarena.testing.cuda import Simulator

    fake = Simulator()
    previous = set_cuda_runtime(CudaRuntime(fake))
    try:
        manager = memory_manager_class(
            lambda device: Pool(HostMemory()), numba_cuda=fake_numba_cuda()
        )(None)
        assert manager.get_memory_info().total == fake.capacity
    finally:
        set_cuda_runtime(previous)
        fake.close()


# --- PyTorch's pluggable allocator, through the real compiled shim -----------------------------




def test_the_shim_calls_back_into_the_allocators_resource(shim: Path) -> None:
    resource = Recording(Pool(HostMemory()))
    allocator = TorchAllocator(resource, shim=shim).activate()
    lib = c_calls(shim)  # as PyTorch calls the library: by its C symbols
    address = lib.ta_malloc(1 << 20, 0, ctypes.c_void_p(0x40))
    assert address and resource.calls == [("allocate", 1 << 20, 0x40)]
    ctypes.memset(address, 7, 1 << 20)
    lib.ta_free(address, 1 << 20, 0, None)  # the default stream: handle 0
    assert resource.calls[-1] == ("deallocate", 1 << 20, 0)
    assert (allocator.allocations, allocator.frees, allocator.failures) == (1, 1, 0)
    lib.ta_free(None, 0, 0, None)  # freeing NULL is a no-op, as for free()
    assert "allocations=1" in repr(allocator) and allocator.path == shim


def test_a_refused_allocation_is_null_and_the_cause_is_kept(shim: Path) -> None:
    allocator = TorchAllocator(Limiting(Pool(HostMemory()), "1MiB"), shim=shim).activate()
    lib = c_calls(shim)
    assert lib.ta_malloc(2 << 20, 0, None) is None
    assert isinstance(allocator.last_error, OutOfMemoryError) and allocator.failures == 1
    lib.ta_free(0x1000, 64, 0, None)  # a foreign address: kept, never raised into C
    assert allocator.failures == 2


def test_a_factory_makes_one_resource_per_device(shim: Path) -> None:
    pools: dict[int, Pool] = {}
    allocator = TorchAllocator(lambda d: pools.setdefault(d, Pool(HostMemory())), shim=shim)
    allocator.activate()
    lib = c_calls(shim)
    first, second = lib.ta_malloc(64, 0, None), lib.ta_malloc(64, 1, None)
    assert allocator.resource(1) is pools[1] and sorted(pools) == [0, 1]
    lib.ta_free(first, 64, 0, None)
    lib.ta_free(second, 64, 1, None)
    assert all(pool.live_blocks() == {} for pool in pools.values())


def test_without_a_shim_the_error_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(ShimUnavailableError, match="build_shim"):
        TorchAllocator(Pool(HostMemory()), shim=tmp_path / "missing.so")
    with pytest.raises(ShimUnavailableError, match=r"could not run|failed"):
        build_shim(tmp_path, compiler=str(tmp_path / "no-such-cc"))
    with pytest.raises(ShimUnavailableError, match="failed"):
        build_shim(tmp_path, compiler="false")
    with pytest.raises(InvalidArgumentError):
        TorchAllocator(42, shim=tmp_path / "x.so")  # type: ignore[arg-type]


def test_find_shim_honours_the_environment(shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORARENA_TORCH_SHIM", str(shim))
    assert find_shim() == shim
