"""``tensorarena replay --strategy learned``: the JSON carries the steady footprint, lists and
``--recommend`` take it, and on a repeated step the planned steps reserve what they use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tensorarena.cli.main import main
from tensorarena.core import STRATEGIES
from tensorarena.trace import Event, Trace, write_csv
from tensorarena.trace.configs import configuration
from tensorarena.trace.recommend import recommend

#: One step of a loop: temporaries freed in the step, one block (a "gradient") kept into the
#: next step and freed at its start.
_STEP = [("a", 0, 4096), ("a", 1, 65536), ("f", 0, 4096), ("a", 2, 32768), ("a", 3, 1024),
         ("f", 1, 65536), ("a", 4, 16384), ("f", 2, 32768), ("f", 4, 16384), ("a", 5, 2048),
         ("f", 3, 1024)]


def _steps(count: int, *, warm_up: bool = False) -> Trace:
    events: list[Event] = []
    if warm_up:  # lasting state made before the loop: a lower level in front of it
        events += [Event("a", 10_000, 300_000), Event("a", 10_001, 300_000)]
    for k in range(count):
        if k:
            events.append(Event("f", 100 * (k - 1) + 5, 2048))
        events += [Event(op, 100 * k + ident, nbytes) for op, ident, nbytes in _STEP]
    events.append(Event("f", 100 * (count - 1) + 5, 2048))
    if warm_up:
        events += [Event("f", 10_000, 300_000), Event("f", 10_001, 300_000)]
    return Trace.from_events(events, name="steps")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["replay", *argv, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.fixture
def steps_file(tmp_path: Path) -> Path:
    path = tmp_path / "steps.csv"
    write_csv(_steps(12), path)
    return path


def test_learned_reports_the_steady_footprint(steps_file: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, str(steps_file), "--strategy", "best_fit,learned")
    learned, best_fit = data["results"]["learned"], data["results"]["best_fit"]
    assert best_fit["steady_footprint_ratio"] is None
    assert learned["failures"] == 0
    # The steps served from the plan hold one arena at the peak of live bytes (alignment aside).
    assert 1.0 <= learned["steady_footprint_ratio"] <= 1.01
    assert learned["footprint_ratio"] <= best_fit["footprint_ratio"]
    assert learned["end_footprint_ratio"] <= learned["steady_footprint_ratio"]


def test_all_and_learned_in_a_list(steps_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, str(steps_file), "--strategy", "all,learned")
    ran = set(data["results"]) | set(data["skipped"])
    assert ran == {*STRATEGIES, "pytorch_like", "glibc", "jemalloc", "mimalloc", "learned"}
    assert "learned" not in _json(capsys, str(steps_file), "--strategy", "all")["results"]


def test_the_table_lists_learned(steps_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(steps_file), "--strategy", "learned", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "learned" in out and "steady" in out
    assert main(["replay", str(steps_file), "--strategy", "best_fit", "--quiet"]) == 0
    assert "steady" not in capsys.readouterr().out


def test_recommend_considers_learned() -> None:
    advice = recommend(_steps(12), strategies=["best_fit"], growths=["next_power_of_two"],
                       baselines=["pytorch_like"])
    names = [r.configuration.name for r in advice.ranking]
    assert "learned" in names
    ranked = advice.as_dict()["ranking"]
    assert not next(r for r in ranked if r["configuration"] == "learned")["baseline"]
    assert configuration("learned").code().startswith("tensorarena.LearnedPlans(")


def test_a_trace_with_a_warm_up_is_served_once_the_period_ran_three_times() -> None:
    result = configuration("learned").run(_steps(40, warm_up=True))
    assert result.steady_footprint_ratio is not None and result.failures == 0


def test_a_trace_without_repeats_is_served_by_the_fallback_within_the_pools_peak() -> None:
    events = [Event("a", i, 1000 + 37 * i) for i in range(50)]
    events += [Event("f", i, 1000 + 37 * i) for i in range(50)]
    trace = Trace.from_events(events)
    learned = configuration("learned").run(trace)
    assert learned.steady_footprint_ratio is None and learned.failures == 0
    assert learned.peak_live_bytes <= learned.peak_reserved_bytes
    assert learned.peak_reserved_bytes <= configuration("best_fit").run(trace).peak_reserved_bytes
