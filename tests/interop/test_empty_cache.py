"""``empty_cache()``: cached blocks and empty arenas go back; live blocks never do."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.adaptors import ThreadCached
from tensorarena.errors import InvalidResourceError
from tensorarena.memory import HostMemory, Pool, Segments

MiB = 1024 * 1024


def _stack() -> tuple[ThreadCached, Pool]:
    pool = Pool(HostMemory(), growth=Segments(), initial_size=0)
    return ThreadCached(pool), pool


def test_cached_blocks_and_empty_arenas_go_back() -> None:
    cached, pool = _stack()
    small = ta.empty(1000, np.uint8, resource=cached)
    large = ta.empty(5 * MiB, np.uint8, resource=cached)
    small[:] = 1
    large[:] = 2
    del small, large
    gc.collect()
    # the small block sits in the thread cache, so the first arena is not empty before
    assert pool.statistics().allocations.current == 1
    released = ta.empty_cache(cached)
    assert released == 8 * MiB  # one small arena: the large block fitted beside the small
    assert pool.statistics().reserved_bytes.current == 0


def test_a_live_block_keeps_its_arena_and_its_bytes() -> None:
    cached, pool = _stack()
    kept = ta.empty(5 * MiB, np.uint8, resource=cached)
    kept[:] = 7
    dropped = ta.empty(3 * MiB, np.uint8, resource=cached)
    del dropped
    assert ta.empty_cache(cached) == 4 * MiB  # the dropped block's arena, not the live one's
    assert pool.statistics().reserved_bytes.current == 6 * MiB
    assert int(kept.min()) == int(kept.max()) == 7
    del kept
    assert ta.empty_cache(cached) == 6 * MiB


def test_garbage_in_a_cycle_is_collected_first() -> None:
    cached, pool = _stack()

    class Holder:
        pass

    holder = Holder()
    holder.array = ta.empty(5 * MiB, np.uint8, resource=cached)  # type: ignore[attr-defined]
    holder.me = holder  # type: ignore[attr-defined]
    gc.disable()
    try:
        del holder
        assert ta.empty_cache(cached) == 6 * MiB
        assert pool.statistics().reserved_bytes.current == 0
    finally:
        gc.enable()


def test_the_default_resource_is_the_default() -> None:
    previous = ta.set_default_resource(_stack()[0])
    try:
        array = ta.empty(5 * MiB, np.uint8)
        del array
        assert ta.empty_cache() == 6 * MiB
    finally:
        ta.set_default_resource(previous)


def test_a_non_resource_is_refused() -> None:
    with pytest.raises(InvalidResourceError):
        ta.empty_cache("the default")  # type: ignore[arg-type]
