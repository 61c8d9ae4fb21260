"""PyTorch's three calls: memory_summary(), memory_stats(), reset_peak_stats()."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.errors import InvalidArgumentError, InvalidResourceError

PYTORCH_KEYS = [
    f"{name}.all.{field}"
    for name in ("requested_bytes", "allocated_bytes", "active_bytes", "reserved_bytes",
                 "allocation", "segment")
    for field in ("current", "peak", "allocated", "freed")
] + ["inactive_split_bytes", "num_alloc_retries", "num_ooms"]


@pytest.fixture
def fresh_default() -> Iterator[ta.MemoryResource]:
    """A fresh default stack for the test (the process-wide one is restored after it)."""
    pool = ta.Pool(ta.HostMemory(), initial_size="1MiB")
    previous = ta.set_default_resource(ta.ThreadCached(pool))
    try:
        yield ta.default_resource()
    finally:
        ta.set_default_resource(previous)


def test_memory_stats_has_pytorch_keys_with_exact_ints(fresh_default: object) -> None:
    arrays = [ta.empty(1000, np.uint8) for _ in range(3)]
    stats = ta.memory_stats()
    for key in PYTORCH_KEYS:
        assert key in stats, key
        assert type(stats[key]) is int, key
    assert stats["requested_bytes.all.current"] == 3000
    assert stats["allocated_bytes.all.current"] == 3 * 1024  # rounded to 256 each
    assert stats["reserved_bytes.all.current"] == 1 << 20
    assert stats["allocation.all.current"] == 3 and stats["segment.all.current"] == 1
    assert stats["thread_cached.misses"] == 3  # the adaptor's own, prefixed
    del arrays
    stats = ta.memory_stats()
    assert stats["requested_bytes.all.freed"] == 0  # freed into the thread cache, not the pool
    assert stats["thread_cached.cached_blocks"] == 3


def test_memory_summary_with_no_argument_descends_to_the_pool(fresh_default: object) -> None:
    keep = ta.zeros(4096, np.uint8)
    text = ta.memory_summary()
    assert "ThreadCached(Pool(" in text  # the title: the stack's repr
    for row in ("Requested bytes", "Allocated bytes", "Reserved bytes", "Allocations", "Segments"):
        assert row in text, row
    assert "ThreadCached: cached bytes" in text and "hit rate" in text
    assert "4 KiB" in text and "1 MiB" in text
    del keep


def test_reset_peak_stats_resets_every_layer(fresh_default: object) -> None:
    big = ta.empty(1 << 18, np.uint8)  # 256 KiB, above nothing yet
    del big
    ta.default_resource().flush_all()  # type: ignore[attr-defined]
    small = ta.empty(100, np.uint8)
    assert ta.memory_stats()["requested_bytes.all.peak"] == 1 << 18
    ta.reset_peak_stats()
    assert ta.memory_stats()["requested_bytes.all.peak"] == 100
    del small


def test_a_resource_without_statistics_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="keeps no statistics"):
        ta.memory_stats(object())
    with pytest.raises(InvalidArgumentError):
        ta.memory_summary(42)


@pytest.mark.parametrize("call", [ta.memory_summary, ta.memory_stats, ta.reset_peak_stats])
def test_a_class_given_for_a_resource_is_refused_with_what_to_do(
    call: Callable[[object], object],
) -> None:
    # memory_summary(Pool) called the unbound Pool.statistics(): TypeError missing 'self'.
    with pytest.raises(InvalidResourceError, match=r"call it, e.g. Pool\(\)"):
        call(ta.Pool)


def _limit_line(summary: str) -> str:
    (line,) = [row for row in summary.splitlines() if row.startswith("| Limit:")]
    return line.strip("| ").strip()


def test_the_main_block_shows_the_tightest_limit_of_the_stack() -> None:
    from tensorarena.adaptors.limiting import Limiting

    pool = ta.Pool(Limiting(ta.VirtualMemory(), "4MiB"), maximum_size="8MiB")
    assert _limit_line(ta.memory_summary(pool)) == \
        "Limit: 4 MiB (the tightest, Limiting's; 8 MiB here)"
    assert _limit_line(ta.memory_summary(Limiting(pool, "2MiB"))) == \
        "Limit: 2 MiB (the tightest, Limiting's; 8 MiB here)"
    # a looser limit above: the pool's own, as it was
    plain = ta.Pool(ta.VirtualMemory(), maximum_size="8MiB")
    assert _limit_line(ta.memory_summary(Limiting(plain, "16MiB"))) == "Limit: 8 MiB"
    assert _limit_line(ta.memory_summary(Limiting(plain, "8MiB"))) == "Limit: 8 MiB"  # a tie
    # no limit of its own: the tightest above it, and that it has none
    assert _limit_line(ta.memory_summary(Limiting(ta.Pool(ta.VirtualMemory()), "1MiB"))) == \
        "Limit: 1 MiB (the tightest, Limiting's; none here)"
