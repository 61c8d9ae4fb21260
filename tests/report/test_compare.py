"""The side-by-side page: one scale for every run, units from the data, a clear refusal."""

from __future__ import annotations

import pytest
from _events import random_events

from tensorarena.errors import InvalidArgumentError
from tensorarena.report import timeline_from_events
from tensorarena.trace import Event

pytest.importorskip("plotly", reason="the comparison page needs the viz extra (plotly)")


def test_every_run_is_on_the_page_with_its_peaks() -> None:
    from tensorarena.report.compare import render_comparison

    eager = timeline_from_events(random_events(400, seed=1))
    planned = timeline_from_events([Event("a", 0, 3 << 20, 0, 0), Event("f", 0, 3 << 20, 0, 5)])
    page = render_comparison([eager, planned], ["eager", "planned"], heading="m: both")
    assert "<h1>m: both</h1>" in page
    for text in ("eager: live and reserved", "planned: block layout", "<td>3 MiB</td>"):
        assert text in page
    assert page.count("<tr><th>") == 3  # the header and a row per run


def test_titles_must_match_the_timelines() -> None:
    from tensorarena.report.compare import render_comparison

    one = timeline_from_events([Event("a", 0, 8), Event("f", 0, 8)])
    with pytest.raises(InvalidArgumentError, match="one title per timeline"):
        render_comparison([one, one], ["only one"])
    with pytest.raises(InvalidArgumentError, match="at least one"):
        render_comparison([], [])
