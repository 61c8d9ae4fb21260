"""The resource conformance suite: every resource and every adaptor goes through the same checks.

To add one, append one line to ``RESOURCES``: ``pytest.param(factory, id=...)``, where
``factory()`` makes a fresh resource. Whether its addresses are real memory is read from its
``memory_kind`` (the suite then writes and reads patterns through them). A resource that has
``statistics()`` and/or ``live_blocks()`` is also checked to leave them unchanged when a call
raises.
"""

from __future__ import annotations

import ctypes
import decimal
import itertools
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from _upstreams import BufferMemory
from tensorarena import Arena, MemoryKind
from tensorarena.adaptors import (
    Counting,
    Guarded,
    Limiting,
    Logging,
    Poisoning,
    StreamOrdered,
    ThreadCached,
    ThreadSafe,
    Tracking,
)
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    SizeMismatchError,
)
from tensorarena.learned import LearnedPlans
from tensorarena.memory.cuda import CudaHostAllocBackend, CudaMemory, CudaRuntime, ManagedMemory
from tensorarena.memory.growth import Doubling, SameAsRequested
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pinned import PinnedHostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource
from tensorarena.memory.virtual import VirtualMemory
from tensorarena.streams import CpuStream
from tensorarena.testing.cuda import Simulator
from tensorarena.torch import NativePool
from tensorarena.trace import PyTorchLike

# --- the resources under test: one line each --------------------------------------------------

RESOURCES = [
    pytest.param(HostMemory, id="host"),
    pytest.param(lambda: HostMemory(huge_pages=True), id="host-huge-pages"),
    pytest.param(lambda: HostMemory(numa_node=0), id="host-numa0"),
    pytest.param(lambda: PinnedHostMemory(limit="64MiB"), id="pinned"),
    pytest.param(VirtualMemory, id="virtual"),
    pytest.param(lambda: Arena("64MiB", "tlsf", base=1 << 40), id="arena"),
    pytest.param(lambda: Pool(HostMemory()), id="pool-host"),
    pytest.param(lambda: Pool(HostMemory(), thread_safe=False), id="pool-host-unlocked"),
    pytest.param(
        lambda: Pool(VirtualMemory(), strategy="tlsf", growth=SameAsRequested()),
        id="pool-virtual-tlsf",
    ),
    pytest.param(lambda: Pool(Pool(VirtualMemory()), strategy="buddy"), id="pool-pool"),
    pytest.param(lambda: Pool(Arena("1GiB", base=1 << 40)), id="pool-arena"),
    pytest.param(lambda: Pool(BufferMemory(), growth=SameAsRequested()), id="pool-buffer"),
    pytest.param(
        lambda: Pool(BufferMemory(), strategy="segregated_fit", growth=Doubling("1MiB")),
        id="pool-buffer-doubling",
    ),
    pytest.param(lambda: ThreadSafe(Pool(HostMemory())), id="thread-safe-pool"),
    pytest.param(lambda: ThreadCached(Pool(HostMemory())), id="thread-cached-pool"),
    pytest.param(
        lambda: ThreadCached(ThreadSafe(Pool(BufferMemory()))), id="thread-cached-thread-safe"
    ),
    pytest.param(lambda: Counting(Pool(VirtualMemory())), id="counting-pool"),
    pytest.param(lambda: Counting(HostMemory()), id="counting-host"),
    pytest.param(lambda: Limiting(Pool(HostMemory()), "64MiB"), id="limiting-pool"),
    pytest.param(lambda: Tracking(Pool(HostMemory()), stack_depth=4), id="tracking-pool"),
    pytest.param(lambda: Guarded(Pool(HostMemory())), id="guarded-pool"),
    pytest.param(lambda: Guarded(Pool(HostMemory()), guard_pages=True), id="guarded-pages-pool"),
    pytest.param(lambda: Poisoning(Pool(HostMemory())), id="poisoning-pool"),
    pytest.param(
        lambda: Poisoning(Pool(BufferMemory()), quarantine="64KiB", fill_new=0xCD),
        id="poisoning-small-quarantine",
    ),
    pytest.param(lambda: Logging(Pool(HostMemory())), id="logging-pool"),
    pytest.param(lambda: PyTorchLike(HostMemory()), id="pytorch-like-host"),
    pytest.param(lambda: CudaMemory(runtime=CudaRuntime(Simulator())), id="cuda-fake"),
    pytest.param(lambda: ManagedMemory(runtime=CudaRuntime(Simulator())), id="managed-fake"),
    pytest.param(lambda: Pool(CudaMemory(1, runtime=CudaRuntime(Simulator()))), id="pool-cuda"),
    pytest.param(
        lambda: PinnedHostMemory(CudaHostAllocBackend(runtime=CudaRuntime(Simulator()))),
        id="pinned-cuda-host-alloc-fake",
    ),
    pytest.param(lambda: StreamOrdered(Pool(HostMemory())), id="stream-ordered-sync"),
    pytest.param(
        lambda: StreamOrdered(Pool(HostMemory()), default_stream=CpuStream()),
        id="stream-ordered-cpu-stream",
    ),
    pytest.param(lambda: LearnedPlans(HostMemory()), id="learned-recording"),
    pytest.param(lambda: _learned_serving(), id="learned-serving"),
    pytest.param(lambda: LearnedPlans(VirtualMemory(), detect_steps=True), id="learned-detect"),
    pytest.param(lambda: NativePool(size="256MiB"), id="native-pool"),
    pytest.param(lambda: NativePool(size="256MiB", native=False), id="native-pool-python-books"),
    pytest.param(lambda: NativePool(size="1MiB", fallback=Pool(HostMemory())),
                 id="native-pool-fallback"),
]


def _learned_serving() -> LearnedPlans:
    """A LearnedPlans with a plan that serves the step in progress (sizes the suite uses)."""
    plans = LearnedPlans(HostMemory())
    for nbytes in (1, 64, 100, 4096, 1000, 256):
        plans.deallocate(plans.allocate(nbytes), nbytes)
    plans.step()
    return plans

# ---------------------------------------------------------------------------------------------

Factory = Callable[[], MemoryResource]


@pytest.fixture(params=RESOURCES)
def resource(request: pytest.FixtureRequest) -> MemoryResource:
    from tensorarena.memory.numa import NumaBindError

    try:
        return request.param()  # type: ignore[no-any-return]
    except NumaBindError as exc:  # pragma: no cover - containers that forbid mbind
        pytest.skip(f"mbind refused here: {exc}")


def _has_bytes(resource: MemoryResource) -> bool:
    return resource.memory_kind.host_accessible


def _state(resource: Any) -> tuple[object, object]:
    """Everything observable about a resource's bookkeeping, for before/after comparisons."""
    stats = resource.statistics() if callable(getattr(resource, "statistics", None)) else None
    live = resource.live_blocks() if callable(getattr(resource, "live_blocks", None)) else None
    return stats, live


def _allocate(resource: MemoryResource, nbytes: Any, alignment: Any = 256) -> int:
    from tensorarena.memory.numa import NumaBindError

    try:
        return resource.allocate(nbytes, alignment)
    except NumaBindError as exc:  # pragma: no cover - containers that forbid mbind
        pytest.skip(f"mbind refused here: {exc}")


def test_satisfies_the_protocol(resource: MemoryResource) -> None:
    assert isinstance(resource, MemoryResource)
    assert isinstance(resource.memory_kind, MemoryKind)
    address = _allocate(resource, 1000)
    assert type(address) is int and address > 0
    assert address % 256 == 0  # the default alignment
    resource.deallocate(address, 1000)
    # stream=None is accepted positionally and by keyword.
    address = resource.allocate(64, 256, None)
    resource.deallocate(address, 64, None)
    address = resource.allocate(64, alignment=256, stream=None)
    resource.deallocate(address, 64, stream=None)


@pytest.mark.parametrize("alignment", [1, 8, 64, 256, 4096, 65536, 1 << 21])
def test_alignment_is_honoured(resource: MemoryResource, alignment: int) -> None:
    addresses = [_allocate(resource, nbytes, alignment) for nbytes in (1, 100, 5000)]
    for address, nbytes in zip(addresses, (1, 100, 5000), strict=True):
        assert address % alignment == 0
        if _has_bytes(resource):
            ctypes.memset(address, 0xAB, nbytes)
            assert ctypes.string_at(address, nbytes) == b"\xab" * nbytes
        resource.deallocate(address, nbytes)
    assert _state(resource)[1] in (None, {})


def test_live_blocks_are_disjoint_and_keep_their_bytes(resource: MemoryResource) -> None:
    rng = random.Random(1234)
    has_bytes = _has_bytes(resource)
    live: dict[int, tuple[int, int]] = {}  # address -> (nbytes, pattern byte)
    for step in range(120):
        if live and rng.random() < 0.4:
            address = rng.choice(sorted(live))
            nbytes, pattern = live.pop(address)
            if has_bytes:
                assert ctypes.string_at(address, nbytes) == bytes([pattern]) * nbytes
            resource.deallocate(address, nbytes)
            continue
        nbytes = rng.choice([1, 7, 256, 4096, 4097, 30_000])
        address = _allocate(resource, nbytes, rng.choice([8, 256, 4096]))
        pattern = step % 251 + 1
        if has_bytes:
            ctypes.memset(address, pattern, nbytes)
        live[address] = (nbytes, pattern)
        spans = sorted((a, a + n) for a, (n, _) in live.items())
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, "two live blocks overlap"
    for address, (nbytes, pattern) in live.items():
        if has_bytes:
            assert ctypes.string_at(address, nbytes) == bytes([pattern]) * nbytes
        resource.deallocate(address, nbytes)


@pytest.mark.parametrize(
    "nbytes", [0, -1, -4096, 1.5, 64.0, None, True, "lots", "-5", [64], 1 << 61, "9" * 5000]
)
def test_bad_sizes_raise_and_change_nothing(resource: MemoryResource, nbytes: Any) -> None:
    keep = _allocate(resource, 128)
    before = _state(resource)
    with pytest.raises(InvalidSizeError):
        resource.allocate(nbytes)
    assert _state(resource) == before
    resource.deallocate(keep, 128)


@pytest.mark.parametrize(
    "alignment", [0, -256, 3, 100, 1.0, "256", None, True, 1 << 61, decimal.Decimal(256)]
)
def test_bad_alignments_raise_and_change_nothing(resource: MemoryResource, alignment: Any) -> None:
    keep = _allocate(resource, 128)
    before = _state(resource)
    with pytest.raises(InvalidAlignmentError):
        resource.allocate(64, alignment)
    assert _state(resource) == before
    resource.deallocate(keep, 128)


def test_bad_frees_raise_and_change_nothing(resource: MemoryResource) -> None:
    block = _allocate(resource, 4096)
    freed = _allocate(resource, 512)
    resource.deallocate(freed, 512)
    before = _state(resource)

    with pytest.raises(DoubleFreeError):
        resource.deallocate(freed, 512)
    assert _state(resource) == before

    with pytest.raises(SizeMismatchError) as mismatch:
        resource.deallocate(block, 4095)
    assert mismatch.value.allocated == 4096 and mismatch.value.given == 4095
    assert _state(resource) == before

    for foreign in (block + 16, 0x10, 1 << 59):
        with pytest.raises(InvalidAddressError) as error:
            resource.deallocate(foreign, 4096)
        assert not isinstance(error.value, DoubleFreeError)
        assert _state(resource) == before

    # Only exact ints (or integer-likes) are addresses: a float or Decimal equal to a live
    # address must not free it.
    for wrong in ("0x1000", float(block), decimal.Decimal(block), None, True, -block):
        with pytest.raises(InvalidAddressError):
            resource.deallocate(wrong, 4096)  # type: ignore[arg-type]
        assert _state(resource) == before

    # The block survived every failed free: still usable, and freeable exactly once.
    if _has_bytes(resource):
        ctypes.memset(block, 0x5A, 4096)
        assert ctypes.string_at(block, 4096) == b"\x5a" * 4096
    resource.deallocate(block, 4096)
    with pytest.raises(DoubleFreeError):
        resource.deallocate(block, 4096)


def test_integer_likes_and_size_strings_are_normalised_at_the_edge(
    resource: MemoryResource,
) -> None:
    """np.int64 and "4KiB" mean the same as the int, in allocate *and* deallocate, and nothing
    but exact ints reaches the bookkeeping (a cached np.int64 size could never be flushed)."""
    first = _allocate(resource, np.int64(4096), np.int64(256))
    second = _allocate(resource, "4KiB")
    resource.deallocate(np.int64(first), np.int64(4096))
    resource.deallocate(second, "4KiB")
    for _ in range(3):  # through any cache and back
        address = _allocate(resource, np.int32(100))
        resource.deallocate(address, 100)
    flush = getattr(resource, "flush_all", None)
    if flush is not None:
        flush()
    stats, live = _state(resource)
    assert live in (None, {})
    if stats is not None:
        for value in vars(stats).values() if hasattr(stats, "__dict__") else ():
            assert type(value) is not np.int64
    assert not _live_counts_of(stats)


def _live_counts_of(stats: object) -> int:
    """Live blocks according to a statistics record (0 if it has no such count)."""
    allocations = getattr(stats, "allocations", None)
    if allocations is not None:
        return int(allocations.current)
    return int(getattr(stats, "live_blocks", 0))


def test_freed_memory_can_be_allocated_again(resource: MemoryResource) -> None:
    for _ in range(50):
        address = _allocate(resource, 100_000)
        if _has_bytes(resource):
            ctypes.memset(address, 1, 100_000)
        resource.deallocate(address, 100_000)
    assert _state(resource)[1] in (None, {})


def test_peak_statistics_can_be_reset(resource: MemoryResource) -> None:
    if not callable(getattr(resource, "statistics", None)):
        pytest.skip("keeps no statistics")
    big = _allocate(resource, 1 << 20)
    resource.deallocate(big, 1 << 20)
    small = _allocate(resource, 1000)
    stats = resource.statistics()  # type: ignore[attr-defined]
    requested = getattr(stats, "requested_bytes", None)
    if requested is not None:
        assert requested.peak >= (1 << 20) and requested.current == 1000
        resource.reset_peak_stats()  # type: ignore[attr-defined]
        assert resource.statistics().requested_bytes.peak == 1000  # type: ignore[attr-defined]
    resource.deallocate(small, 1000)
