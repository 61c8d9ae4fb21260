"""The timeline behind tensorarena viz: from a trace (replayed on a pool) and from a snapshot
(its own addresses); checked against a plain recomputation of the live bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _events import live_bytes, random_events

from tensorarena.errors import InvalidArgumentError
from tensorarena.memory.host import HostMemory
from tensorarena.memory.pool import Pool
from tensorarena.report import (
    dump_snapshot,
    load_timeline,
    record_memory_history,
    timeline_from_events,
    timeline_from_snapshot,
)
from tensorarena.report.views import views
from tensorarena.trace import MalformedTraceError, Trace, write_trace


def _no_overlap(timeline) -> bool:  # type: ignore[no-untyped-def]
    """No two blocks share bytes while both are live (the placement a pool made is real)."""
    end = np.where(np.isnan(timeline.block_end), np.inf, timeline.block_end)
    for step in range(0, timeline.steps, max(1, timeline.steps // 50)):
        alive = timeline.live_at(step)
        y0 = timeline.offsets(timeline.block_address[alive])
        order = np.argsort(y0)
        y0, size = y0[order], timeline.block_size[alive][order]
        if np.any(y0[:-1] + size[:-1] > y0[1:]):
            return False
    return bool(end.size >= 0)


@pytest.mark.parametrize("strategy", ["best_fit", "tlsf"])
def test_a_trace_replayed_on_a_pool(strategy: str) -> None:
    events = random_events(3000)
    timeline = timeline_from_events(events, strategy=strategy, name="t")
    assert timeline.steps == 3000 and timeline.time_unit == "us"
    assert np.array_equal(timeline.live, live_bytes(events))
    assert timeline.reserved is not None and np.all(timeline.reserved >= timeline.live)
    assert timeline.blocks == sum(e.op == "a" for e in events)
    still = int(np.isnan(timeline.block_end).sum())
    assert timeline.block_size[np.isnan(timeline.block_end)].sum() == timeline.live[-1]
    assert still > 0 and set(timeline.sites) == {"attn", "mlp", "kv"}
    assert _no_overlap(timeline)
    assert strategy in timeline.source


def test_untimed_events_use_the_action_number() -> None:
    events = random_events(200, times=False)
    timeline = timeline_from_events(events)
    assert timeline.time_unit == "action"
    assert np.array_equal(timeline.time, np.arange(200))


def test_a_snapshot_file_uses_its_own_addresses(tmp_path: Path) -> None:
    events = random_events(2000)
    path = tmp_path / "t.pickle"
    write_trace(Trace.from_events(events), path, format="pytorch_snapshot")
    timeline = load_timeline(path)
    assert timeline.source == "snapshot" and timeline.steps == 2000
    assert np.array_equal(timeline.live, live_bytes(events))
    assert timeline.reserved is not None and np.all(timeline.reserved >= timeline.live)
    assert _no_overlap(timeline)
    csv = tmp_path / "t.csv"
    write_trace(Trace.from_events(events), csv)
    assert np.array_equal(load_timeline(csv).live, timeline.live)


def test_our_own_dump_with_stacks(tmp_path: Path) -> None:
    pool = Pool(HostMemory())
    record_memory_history(resource=pool)
    kept = pool.allocate(5000)  # SITE
    pool.deallocate(pool.allocate(100), 100)
    dump_snapshot(tmp_path / "d.pickle", resource=pool)
    record_memory_history(False, resource=pool)
    timeline = load_timeline(tmp_path / "d.pickle")
    assert list(timeline.live) == [5000, 5100, 5000]
    assert timeline.sites[timeline.block_site[0]].startswith("test_timeline.py:")
    pool.deallocate(kept, 5000)


def test_blocks_from_before_the_history_are_drawn_from_the_start() -> None:
    data = {
        "segments": [{"device": 0, "address": 0x1000, "total_size": 0x3000, "blocks": [
            {"address": 0x1000, "size": 0x1000, "requested_size": 0x1000,
             "state": "active_allocated", "frames": []},
            {"address": 0x2000, "size": 0x2000, "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "free_completed", "addr": 0x2000, "size": 0x800, "time_us": 5},
            {"action": "alloc", "addr": 0x2000, "size": 0x100, "time_us": 7},
            {"action": "free_completed", "addr": 0x2000, "size": 0x100, "time_us": 9},
        ]],
    }
    timeline = timeline_from_snapshot(data)
    assert list(timeline.live) == [0x1000, 0x1100, 0x1000]
    assert timeline.blocks == 3
    assert np.isnan(timeline.block_end).sum() == 1  # the active block lives on
    assert list(timeline.reserved) == [0x3000] * 3  # type: ignore[arg-type]


def test_malformed_inputs_are_errors(tmp_path: Path) -> None:
    with pytest.raises(MalformedTraceError):
        timeline_from_snapshot([1, 2, 3])
    with pytest.raises(MalformedTraceError, match="not live"):
        timeline_from_snapshot({"device_traces": [[
            {"action": "alloc", "addr": 1, "size": 8},
            {"action": "alloc", "addr": 1, "size": 8},
            {"action": "free_completed", "addr": 1, "size": 8},
            {"action": "free_completed", "addr": 1, "size": 8}]]})
    bad = tmp_path / "bad.csv"
    bad.write_text("op,id,size\na,0,10\nf,1,10\n")
    with pytest.raises(MalformedTraceError, match="line 3"):
        load_timeline(bad)


def test_views_aggregate_a_large_timeline_and_say_so() -> None:
    events = random_events(20_000)
    timeline = timeline_from_events(events)
    small = views(timeline, max_points=50_000, max_blocks=50_000)
    assert small.downsampled == 1 and small.rectangles is not None and not small.notes
    large = views(timeline, max_points=500, max_blocks=1000, time_samples=50,
                  address_bins=40)
    assert len(large.time) == 500 and large.live.max() == timeline.live.max()  # peaks kept
    assert large.occupancy is not None and large.occupancy.shape == (50, 40)
    assert large.occupancy.min() >= 0 and large.occupancy.max() <= 1
    assert any("maximum over" in n for n in large.notes)
    assert any("bands of memory" in n for n in large.notes)
    # The occupancy is exact in memory: at each sampled instant it sums to the live bytes.
    band = large.occupancy_edges[1] - large.occupancy_edges[0]  # type: ignore[index]
    for row, when in enumerate(large.occupancy_time):  # type: ignore[arg-type]
        step = int(np.searchsorted(timeline.time, when, side="right")) - 1
        expected = timeline.live[step] if step >= 0 else 0
        assert large.occupancy[row].sum() * band == pytest.approx(expected, rel=1e-6, abs=1)
    at_peak = timeline.live_at(timeline.peak_index)
    assert large.site_peak.sum() == timeline.block_size[at_peak].sum() == timeline.live.max()


@pytest.mark.parametrize("index", [10**9, -10**9, 1.5, "0", None, True], ids=repr)
def test_a_step_index_outside_the_timeline_is_an_invalid_argument(index: object) -> None:
    # live_at(10**9) raised NumPy's IndexError, live_at(1.5) an IndexError about slices.
    timeline = timeline_from_events(random_events(50))
    with pytest.raises(InvalidArgumentError):
        timeline.live_at(index)  # type: ignore[arg-type]
    assert timeline.live_at(-1).shape == timeline.live_at(timeline.steps - 1).shape
