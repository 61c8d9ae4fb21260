"""The resource conformance suite: every memory resource is run through the same checks.

To add a resource, append one ``pytest.param((factory, has_bytes), id=...)`` to ``RESOURCES``:
``factory()`` makes a fresh resource; ``has_bytes`` says whether its addresses are real memory
(the suite then writes and reads patterns through them). Everything else is generic: a resource
that has ``statistics()`` and/or ``live_blocks()`` is also checked to leave them unchanged when a
call raises.
"""

from __future__ import annotations

import ctypes
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from tensorarena.adaptors import Limiting, Statistics, ThreadCached, ThreadSafe
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    SizeMismatchError,
)
from tensorarena.memory.growth import SameAsRequested
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pinned import PinnedHostMemory
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource
from tensorarena.memory.virtual import VirtualMemory

# --- the resources under test (factory, has real bytes) -------------------------------------

RESOURCES = [
    pytest.param((HostMemory, True), id="host"),
    pytest.param((lambda: HostMemory(huge_pages=True), True), id="host-huge-pages"),
    pytest.param((lambda: HostMemory(numa_node=0), True), id="host-numa0"),
    pytest.param((lambda: PinnedHostMemory(limit="64MiB"), True), id="pinned"),
    pytest.param((VirtualMemory, False), id="virtual"),
    pytest.param((lambda: Pool(HostMemory()), True), id="pool-host"),
    pytest.param(
        (lambda: Pool(VirtualMemory(), strategy="tlsf", growth=SameAsRequested()), False),
        id="pool-virtual-tlsf",
    ),
    pytest.param((lambda: Pool(Pool(VirtualMemory()), strategy="buddy"), False), id="pool-pool"),
    pytest.param((lambda: ThreadSafe(Pool(HostMemory())), True), id="thread-safe-pool"),
    pytest.param(
        (lambda: ThreadCached(ThreadSafe(Pool(HostMemory()))), True), id="thread-cached-pool"
    ),
    pytest.param((lambda: Statistics(Pool(VirtualMemory())), False), id="statistics-pool"),
    pytest.param((lambda: Limiting(Pool(HostMemory()), "64MiB"), True), id="limiting-pool"),
]

# ---------------------------------------------------------------------------------------------

Factory = Callable[[], MemoryResource]


def _make(factory: Factory) -> MemoryResource:
    from tensorarena.memory.numa import NumaBindError

    try:
        return factory()
    except NumaBindError as exc:  # pragma: no cover - containers that forbid mbind
        pytest.skip(f"mbind refused here: {exc}")


def _state(resource: Any) -> tuple[object, object]:
    """Everything observable about a resource's bookkeeping, for before/after comparisons."""
    stats = resource.statistics() if callable(getattr(resource, "statistics", None)) else None
    live = resource.live_blocks() if callable(getattr(resource, "live_blocks", None)) else None
    return stats, live


def _allocate(resource: MemoryResource, nbytes: int, alignment: int = 256) -> int:
    from tensorarena.memory.numa import NumaBindError

    try:
        return resource.allocate(nbytes, alignment)
    except NumaBindError as exc:  # pragma: no cover - containers that forbid mbind
        pytest.skip(f"mbind refused here: {exc}")


@pytest.fixture(params=RESOURCES)
def case(request: pytest.FixtureRequest) -> tuple[MemoryResource, bool]:
    factory, has_bytes = request.param
    return _make(factory), has_bytes


def test_satisfies_the_protocol(case: tuple[MemoryResource, bool]) -> None:
    resource, _ = case
    assert isinstance(resource, MemoryResource)
    address = resource.allocate(1000)
    assert type(address) is int and address > 0
    resource.deallocate(address, 1000)
    # stream=None is accepted positionally and by keyword.
    address = resource.allocate(64, 256, None)
    resource.deallocate(address, 64, None)
    address = resource.allocate(64, alignment=256, stream=None)
    resource.deallocate(address, 64, stream=None)


@pytest.mark.parametrize("alignment", [1, 8, 64, 256, 4096, 65536, 1 << 21])
def test_alignment_is_honoured(case: tuple[MemoryResource, bool], alignment: int) -> None:
    resource, has_bytes = case
    addresses = [_allocate(resource, nbytes, alignment) for nbytes in (1, 100, 5000)]
    for address, nbytes in zip(addresses, (1, 100, 5000), strict=True):
        assert address % alignment == 0
        if has_bytes:
            ctypes.memset(address, 0xAB, nbytes)
            assert ctypes.string_at(address, nbytes) == b"\xab" * nbytes
        resource.deallocate(address, nbytes)
    assert _state(resource)[1] in (None, {})


def test_live_blocks_are_disjoint_and_keep_their_bytes(case: tuple[MemoryResource, bool]) -> None:
    resource, has_bytes = case
    rng = random.Random(1234)
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


@pytest.mark.parametrize("nbytes", [0, -1, -4096, 1.5, None, True, "lots", [64], 1 << 61])
def test_bad_sizes_raise_and_change_nothing(case: tuple[MemoryResource, bool], nbytes: Any) -> None:
    resource, _ = case
    keep = resource.allocate(128)
    before = _state(resource)
    with pytest.raises(InvalidSizeError):
        resource.allocate(nbytes)
    assert _state(resource) == before
    resource.deallocate(keep, 128)


@pytest.mark.parametrize("alignment", [0, -256, 3, 100, 1.0, "256", None, True])
def test_bad_alignments_raise_and_change_nothing(
    case: tuple[MemoryResource, bool], alignment: Any
) -> None:
    resource, _ = case
    keep = resource.allocate(128)
    before = _state(resource)
    with pytest.raises(InvalidAlignmentError):
        resource.allocate(64, alignment)
    assert _state(resource) == before
    resource.deallocate(keep, 128)


def test_bad_frees_raise_and_change_nothing(case: tuple[MemoryResource, bool]) -> None:
    resource, has_bytes = case
    block = resource.allocate(4096)
    freed = resource.allocate(512)
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

    with pytest.raises(InvalidAddressError):
        resource.deallocate("0x1000", 4096)  # type: ignore[arg-type]
    assert _state(resource) == before

    # The block survived every failed free: still usable, and freeable exactly once.
    if has_bytes:
        ctypes.memset(block, 0x5A, 4096)
        assert ctypes.string_at(block, 4096) == b"\x5a" * 4096
    resource.deallocate(block, 4096)
    with pytest.raises(DoubleFreeError):
        resource.deallocate(block, 4096)


def test_freed_memory_can_be_allocated_again(case: tuple[MemoryResource, bool]) -> None:
    resource, has_bytes = case
    for _ in range(50):
        address = resource.allocate(100_000)
        if has_bytes:
            ctypes.memset(address, 1, 100_000)
        resource.deallocate(address, 100_000)
    assert _state(resource)[1] in (None, {})
