"""Configurations by name, the smallest fixed arena, the system allocators, the recommendation."""

from __future__ import annotations

import sys

import pytest
from _traces import random_trace

from tensorarena.errors import InvalidArgumentError, TensorArenaError
from tensorarena.trace.configs import configuration, smallest_fixed_arena
from tensorarena.trace.recommend import recommend
from tensorarena.trace.system import (
    SYSTEM_ALLOCATORS,
    SystemAllocatorUnavailableError,
    replay_system,
    system_allocator_library,
)


def test_names_parse_to_configurations() -> None:
    config = configuration("best_fit", growth="doubling")
    assert (config.kind, config.strategy, config.growth, config.thread_cached) == (
        "pool", "best_fit", "doubling", False)
    cached = configuration("thread_cached/tlsf/same_as_requested")
    assert cached.thread_cached and cached.growth == "same_as_requested"
    assert configuration("pytorch_like").kind == "pytorch_like"
    assert configuration("glibc").kind == "system"
    assert "Doubling" in config.code() and "ThreadCached(" in cached.code()


@pytest.mark.parametrize("name", ["worst_fit", "best_fit/sometimes", "a/b/c", ""])
def test_unknown_names_list_the_known_ones(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="best_fit"):
        configuration(name)
    with pytest.raises(InvalidArgumentError, match="doubling"):
        configuration("best_fit", growth="tripling")


def test_the_smallest_fixed_arena_serves_the_trace_and_a_smaller_one_does_not() -> None:
    trace = random_trace(400, seed=1, max_bytes=1 << 16)
    config = configuration("best_fit/fixed")
    capacity, result = smallest_fixed_arena(trace, config)
    assert result.failures == 0 and result.peak_reserved_bytes == capacity
    assert capacity >= trace.summary().peak_live_bytes
    from dataclasses import replace

    from tensorarena.trace import replay

    smaller = replace(config, initial_size=int(capacity * 0.99) // 256 * 256)
    assert replay(trace, smaller.make()).failures > 0
    assert configuration("best_fit/fixed").run(trace).failures == 0


linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


@linux
def test_glibc_replays_in_a_child_with_every_page_touched() -> None:
    trace = random_trace(300, seed=2, max_bytes=4 << 20)
    result = replay_system(trace, "glibc")
    assert result.events == len(trace) and result.failures == 0
    assert result.peak_live_bytes == trace.summary().peak_live_bytes
    # Touched pages are resident: the peak resident growth covers most of the peak live bytes.
    assert result.peak_reserved_bytes is not None
    assert result.peak_reserved_bytes > 0.5 * result.peak_live_bytes
    assert result.fragmentation is None and result.upstream_allocs is None


@linux
@pytest.mark.parametrize("name", sorted(SYSTEM_ALLOCATORS))
def test_a_small_trace_is_not_served_from_pages_the_interpreter_freed(name: str) -> None:
    # The shipped decoding trace peaks at 400 KiB of small blocks: without trimming the
    # child's heap first, glibc served it from resident free pages and reported 84 KiB.
    try:
        system_allocator_library(name)
    except SystemAllocatorUnavailableError as reason:
        pytest.skip(str(reason))
    from tensorarena.trace import shipped_traces

    result = replay_system(shipped_traces()["decoding"], name)
    assert result.peak_reserved_bytes is not None
    assert result.peak_reserved_bytes >= result.peak_live_bytes


@pytest.mark.parametrize("name", ["jemalloc", "mimalloc"])
def test_other_allocators_run_or_say_what_to_install(name: str) -> None:
    try:
        system_allocator_library(name)
    except SystemAllocatorUnavailableError as reason:
        assert "apt-get install" in str(reason) or "Linux" in str(reason)
        pytest.skip(str(reason))
    result = replay_system(random_trace(200, seed=3), name)
    assert result.failures == 0 and result.peak_reserved_bytes is not None


def test_an_unknown_allocator_is_unavailable() -> None:
    with pytest.raises(SystemAllocatorUnavailableError, match="unknown"):
        system_allocator_library("tcmalloc")
    # It was a bare Exception: outside the one tree that callers catch.
    with pytest.raises(TensorArenaError, match="unknown"):
        replay_system(random_trace(10, seed=1), 3)  # type: ignore[arg-type]
    assert set(SYSTEM_ALLOCATORS) == {"glibc", "jemalloc", "mimalloc"}


def test_recommend_ranks_footprint_first_and_never_recommends_a_baseline() -> None:
    trace = random_trace(300, seed=6, max_bytes=1 << 20)
    seen: list[str] = []
    # learned=False: this is about the pools and the baselines (learned plans, ranked like a
    # pool, win a trace that never repeats with their segregated fallback memory)
    advice = recommend(trace, strategies=["best_fit", "buddy"],
                       growths=["doubling", "fixed"], baselines=["pytorch_like"],
                       report=seen.append, learned=False)
    assert advice.best is not None and advice.best.configuration.kind == "pool"
    names = [r.configuration.name for r in advice.ranking]
    assert any(n.startswith("thread_cached/") for n in names) and "pytorch_like" in names
    assert len(seen) == len(names)
    usable = [r for r in advice.ranking if r.usable]
    assert advice.best.footprint <= min(r.footprint for r in usable) * (1 + advice.tolerance)
    data = advice.as_dict()
    assert data["recommended"]["configuration"] == advice.best.configuration.name
    assert "Pool(upstream" in data["recommended"]["code"]
