"""The trace model: events, the one check every reader runs, and the summary."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from _traces import brute_force_peak, random_events

from tensorarena import TensorArenaError
from tensorarena.trace import Event, LiveSet, MalformedTraceError, Trace, summarize


def test_a_trace_checks_and_sums_its_events() -> None:
    trace = Trace.from_events([("a", 0, 100), ("a", 1, 50), ("f", 0, 0), ("a", 0, 30)])
    summary = trace.summary()
    assert (summary.events, summary.allocations, summary.frees) == (4, 3, 1)
    assert summary.peak_live_bytes == 150 and summary.peak_live_blocks == 2
    assert summary.live_at_end_bytes == 80 and summary.live_at_end_blocks == 2
    assert summary.peak_event == 1
    assert trace.events[2] == Event("f", 0, 100)  # the free's size is filled in
    assert len(trace) == 4 and next(iter(trace)) == Event("a", 0, 100)


@pytest.mark.parametrize("seed", range(5))
def test_the_summary_agrees_with_a_brute_force_peak(seed: int) -> None:
    events = random_events(500, seed=seed, streams=2)
    assert summarize(events).peak_live_bytes == brute_force_peak(events)
    assert Trace.from_events(events).summary() == summarize(events)


@pytest.mark.parametrize(
    ("events", "number", "column", "words"),
    [
        ([("a", 0, 10), ("a", 0, 10)], 2, "id", "still live"),
        ([("a", 0, 10), ("f", 1, 10)], 2, "id", "not live"),
        ([("a", 0, 10), ("f", 0, 0), ("f", 0, 0)], 3, "id", "not live"),
        ([("a", 0, 10), ("f", 0, 11)], 2, "size", "allocated with 10"),
        ([("a", 0, 0)], 1, "size", "positive"),
        ([("x", 0, 10)], 1, "op", "unknown op"),
        ([("a", -1, 10)], 1, "id", "non-negative"),
        ([("a", 0, 10.5)], 1, "size", "int"),
        ([("a", 0, 10, 0, None, 7)], 1, "tag", "string"),
        (["a,0,10"], 1, None, "tuple"),
    ],
)
def test_a_bad_event_is_refused_with_its_number(events: list[object], number: int,
                                                column: str | None, words: str) -> None:
    with pytest.raises(MalformedTraceError, match=words) as info:
        Trace.from_events(events)  # type: ignore[arg-type]
    assert info.value.line == number and info.value.column == column
    assert isinstance(info.value, TensorArenaError) and isinstance(info.value, ValueError)


def test_a_refused_event_leaves_the_live_set_unchanged() -> None:
    live = LiveSet()
    live.check(Event("a", 0, 10))
    with pytest.raises(MalformedTraceError):
        live.check(Event("f", 0, 11))
    assert live.live == {0: 10} and live.live_bytes == 10


def test_an_id_may_come_back_after_its_free() -> None:
    trace = Trace.from_events([("a", 7, 1), ("f", 7, 1), ("a", 7, 2), ("f", 7, 0)])
    assert trace.events[-1].nbytes == 2


def test_the_summary_is_plain_data() -> None:
    data = Trace.from_events([("a", 0, 10, 0, 5), ("f", 0, 10, 0, 9)]).summary().as_dict()
    assert data["duration_us"] == 4 and data["peak_live_bytes"] == 10


def _every_consumer_of_events() -> dict[str, Callable[[object], object]]:
    from tensorarena.memory import HostMemory, Pool
    from tensorarena.report import timeline_from_events
    from tensorarena.trace import recommend, replay, snapshot_of, write_trace

    out = Path(tempfile.mkdtemp()) / "out.csv"
    return {
        "Trace.from_events": Trace.from_events,
        "summarize": summarize,
        "replay": lambda events: replay(events, Pool(HostMemory())),  # type: ignore[arg-type]
        "recommend": recommend,  # type: ignore[dict-item]
        "write_trace csv": lambda events: write_trace(events, out),  # type: ignore[arg-type]
        "write_trace rmm": lambda events: write_trace(events, out, format="rmm"),  # type: ignore[arg-type]
        "snapshot_of": snapshot_of,  # type: ignore[dict-item]
        "timeline_from_events": timeline_from_events,  # type: ignore[dict-item]
    }


@pytest.mark.parametrize("consumer", sorted(_every_consumer_of_events()))
@pytest.mark.parametrize("events", [3, None, [1, 2], [("a", 1, 64), ("f", 1, 64), 7],
                                    Path("trace.csv")], ids=repr)
def test_what_is_not_events_is_a_malformed_trace_wherever_events_are_taken(
    consumer: str, events: object,
) -> None:
    # A path, a number or a list of numbers given where events belong raised TypeError or
    # AttributeError from deep inside (or wrote a file of garbage) in most of these.
    with pytest.raises(MalformedTraceError):
        _every_consumer_of_events()[consumer](events)
