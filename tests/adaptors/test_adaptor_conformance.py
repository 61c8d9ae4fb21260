"""The resource protocol, checked on every pool and adaptor configuration of this package.

(``tests/memory/test_resource_conformance.py``, when it exists, runs the shared suite; these are
the same promises, checked here so the adaptors are covered whatever that suite's parameter list.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from _adaptor_upstreams import BufferMemory

from tensorarena.adaptors import Limiting, Statistics, ThreadCached, ThreadSafe
from tensorarena.errors import (
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    TensorArenaError,
)
from tensorarena.memory.growth import Doubling, Fixed, SameAsRequested
from tensorarena.memory.pool import Pool
from tensorarena.memory.resource import MemoryResource
from tensorarena.memory.virtual import VirtualMemory

RESOURCES: dict[str, Callable[[], MemoryResource]] = {
    "pool-virtual": lambda: Pool(VirtualMemory()),
    "pool-buffer-fixed": lambda: Pool(BufferMemory(), initial_size="1MiB", growth=Fixed()),
    "pool-tlsf-doubling": lambda: Pool(BufferMemory(), strategy="tlsf", growth=Doubling("1MiB")),
    "pool-over-pool": lambda: Pool(Pool(VirtualMemory()), growth=SameAsRequested()),
    "thread-safe": lambda: ThreadSafe(Pool(BufferMemory())),
    "thread-cached": lambda: ThreadCached(ThreadSafe(Pool(BufferMemory()))),
    "statistics": lambda: Statistics(Pool(BufferMemory())),
    "limiting": lambda: Limiting(Pool(BufferMemory()), "16MiB"),
}


@pytest.fixture(params=sorted(RESOURCES))
def resource(request: pytest.FixtureRequest) -> MemoryResource:
    return RESOURCES[request.param]()


def test_speaks_the_protocol(resource: MemoryResource) -> None:
    assert isinstance(resource, MemoryResource)


def test_blocks_are_aligned_and_disjoint(resource: MemoryResource) -> None:
    blocks: list[tuple[int, int]] = []
    for alignment in (1, 8, 64, 256, 4096):
        for nbytes in (1, 100, 4096, 10_000):
            address = resource.allocate(nbytes, alignment)
            assert isinstance(address, int) and address % alignment == 0
            blocks.append((address, nbytes))
    blocks.sort()
    for (a, n), (b, _) in itertools.pairwise(blocks):
        assert a + n <= b, "live blocks overlap"
    for address, nbytes in blocks:
        resource.deallocate(address, nbytes, None)


def test_default_alignment_is_256(resource: MemoryResource) -> None:
    address = resource.allocate(10)
    assert address % 256 == 0
    resource.deallocate(address, 10)


def test_double_and_foreign_frees_raise(resource: MemoryResource) -> None:
    address = resource.allocate(512)
    resource.deallocate(address, 512)
    if not isinstance(resource, ThreadCached):  # the cache hands it back first: checked apart
        with pytest.raises(InvalidAddressError):
            resource.deallocate(address, 512)
    with pytest.raises(InvalidAddressError):
        resource.deallocate(0x10, 512)


@pytest.mark.parametrize("nbytes", [0, -1, 2**70])
def test_bad_sizes_raise_a_size_error(resource: MemoryResource, nbytes: int) -> None:
    with pytest.raises((InvalidSizeError, TensorArenaError)):
        resource.allocate(nbytes)


@pytest.mark.parametrize("alignment", [0, 3, -8])
def test_bad_alignments_raise(resource: MemoryResource, alignment: int) -> None:
    with pytest.raises(InvalidAlignmentError):
        resource.allocate(64, alignment)
