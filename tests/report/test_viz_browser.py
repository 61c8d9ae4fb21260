"""The viz page in a real headless browser (Debian's Chromium over the DevTools protocol): it
renders with no JavaScript error, its charts have a size, the screenshot is not blank, and a
page made from 10^6 events loads and answers a zoom quickly.

Skipped, saying how to get it, where Chromium is not installed (``apt-get install chromium``;
``TENSORARENA_CHROMIUM`` may name another binary) or plotly is missing (the ``viz`` extra).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from _browser import Browser, chromium
from _events import random_events

from tensorarena.report import timeline_from_events
from tensorarena.trace import Event

pytest.importorskip("plotly", reason="the HTML timeline needs the viz extra (plotly)")
BROWSER = chromium()
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium to test the page in: install Debian's package (apt-get install "
    "chromium) or set TENSORARENA_CHROMIUM to a Chromium binary",
)

_SIZES = """JSON.stringify(['timeline', 'layout', 'sites'].map(id => {
    const element = document.getElementById(id);
    const box = element.getBoundingClientRect();
    return [box.width, box.height, element.querySelectorAll('.main-svg').length];
}))"""

_ZOOM = """(async () => {
    const start = performance.now();
    for (const id of ['timeline', 'layout']) {
        const range = document.getElementById(id).layout.xaxis.range;
        await Plotly.relayout(id, {'xaxis.range': [range[0], (range[0] + range[1]) / 2]});
    }
    return performance.now() - start;
})()"""


def _not_blank(png: bytes) -> tuple[float, int]:
    """(fraction of pixels that are not the background, distinct colours) of a screenshot."""
    image = pytest.importorskip("PIL.Image", reason="reading the screenshot needs Pillow")
    pixels = np.asarray(image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3)
    background = np.all(pixels == pixels[0], axis=1)
    return float(1 - background.mean()), len(np.unique(pixels[::7], axis=0))


def _page(tmp_path: Path, events: list[Event], name: str) -> Path:
    from tensorarena.report.viz import write_html

    path = tmp_path / f"{name}.html"
    write_html(timeline_from_events(events, name=name), path)
    return path


def test_the_page_renders_without_errors(tmp_path: Path) -> None:
    assert BROWSER is not None
    page = _page(tmp_path, random_events(1500), "small")
    with Browser(BROWSER) as browser:
        browser.open(page)
        sizes = browser.evaluate(_SIZES)
        shot = browser.screenshot()
        errors = list(browser.errors)
    assert errors == []
    for width, height, svgs in json.loads(sizes):
        assert width > 500 and height > 200 and svgs >= 1
    drawn, colours = _not_blank(shot)
    assert drawn > 0.05 and colours > 20
    (tmp_path / "small.png").write_bytes(shot)


@pytest.mark.slow
def test_a_million_events_stay_responsive(tmp_path: Path) -> None:
    assert BROWSER is not None
    page = _page(tmp_path, random_events(1_000_000, seed=3), "million")
    # aggregated drawing: not a point per event; the data of every block stays (hover), 16
    # bytes a block here (no sites or allocators), base64: about 10 MB for 500,000 blocks
    assert page.stat().st_size < 20_000_000, page.stat().st_size
    with Browser(BROWSER) as browser:
        seconds = browser.open(page)
        sizes = json.loads(browser.evaluate(_SIZES))
        zoom_ms = browser.evaluate(_ZOOM)
        errors = list(browser.errors)
        drawn, _ = _not_blank(browser.screenshot())
    assert errors == []
    assert all(width > 500 and height > 200 for width, height, _ in sizes)
    assert seconds < 20, f"the page took {seconds:.1f} s to load"
    assert zoom_ms < 2000, f"a zoom took {zoom_ms:.0f} ms"
    assert drawn > 0.05


def test_the_harness_sees_a_planted_javascript_error(tmp_path: Path) -> None:
    """A control: the checks above would catch a page that throws or logs an error."""
    assert BROWSER is not None
    page = tmp_path / "broken.html"
    page.write_text("<html><body><div id='x'>x</div><script>console.error('planted');"
                    "undefinedFunction();</script></body></html>")
    with Browser(BROWSER) as browser:
        browser.open(page)
        browser.evaluate("1")
        errors = list(browser.errors)
    assert any("planted" in e for e in errors)
    assert any("undefinedFunction" in e for e in errors)


_POINT = """(() => {
    const chart = document.getElementById('layout');
    const layer = chart.querySelector('.nsewdrag');
    const box = layer.getBoundingClientRect();
    const xa = chart._fullLayout.xaxis, ya = chart._fullLayout.yaxis;
    const event = new MouseEvent('mousemove', {bubbles: true,
        clientX: box.left + xa.d2p(%f), clientY: box.top + ya.d2p(%f)});
    layer.dispatchEvent(event);
    return new Promise(done => requestAnimationFrame(() => requestAnimationFrame(
        () => done(document.getElementById('block-info').textContent))));
})()"""


def test_every_block_keeps_its_hover_details_when_the_drawing_is_aggregated(
        tmp_path: Path) -> None:
    from tensorarena.report.viz import write_html

    assert BROWSER is not None
    events = random_events(3000, seed=5)
    events = [e._replace(allocator="torch" if e.id % 2 else "tensorarena/default",
                         site=f"model.py:{10 + e.id % 7} in forward; main.py:3 in <module>")
              if e.op == "a" else e for e in events]
    timeline = timeline_from_events(events, name="aggregated")
    page = tmp_path / "aggregated.html"
    write_html(timeline, page, max_blocks=10)  # an occupancy map, not a shape per block
    block = int(np.argmax(timeline.block_size))  # the largest block: easy to point at
    x = (timeline.block_start[block] + (timeline.block_end[block]
         if not np.isnan(timeline.block_end[block]) else timeline.end_time)) / 2
    y = timeline.offsets(timeline.block_address[block:block + 1])[0] + \
        timeline.block_size[block] / 2
    # the axes are ms and MiB here (30,000 µs; megabytes of blocks)
    with Browser(BROWSER) as browser:
        browser.open(page)
        shown = browser.evaluate(_POINT % (x / 1000, y / (1 << 20)))
        curves = json.loads(browser.evaluate(
            "JSON.stringify(document.getElementById('timeline').data.map(t => t.name))"))
        errors = list(browser.errors)
    assert errors == []
    assert {"live: torch", "live: tensorarena/default"} <= set(curves)  # one per allocator
    label = timeline.sites[timeline.block_site[block]]
    allocator = timeline.allocators[timeline.block_allocator[block]]
    assert label in shown and allocator in shown and "main.py:3 in <module>" in shown
    assert "MiB" in shown or "KiB" in shown


_CLIPPED = """JSON.stringify(Array.from(document.querySelectorAll('.js-plotly-plot'))
  .flatMap(plot => {
    const frame = plot.querySelector('.main-svg').getBoundingClientRect();
    return Array.from(plot.querySelectorAll('.gtitle, .annotation-text, .xtitle, .ytitle'))
        .map(t => [t.textContent, t.getBoundingClientRect()])
        .filter(([, b]) => b.width > 0 && (b.top < frame.top - 0.5 || b.bottom > frame.bottom + 0.5
                || b.left < frame.left - 0.5 || b.right > frame.right + 0.5))
        .map(([text]) => text);
}))"""


def test_no_title_of_the_timeline_page_is_clipped(tmp_path: Path) -> None:
    assert BROWSER is not None
    page = _page(tmp_path, random_events(800, seed=2), "titles")
    with Browser(BROWSER, width=900) as browser:  # a narrow window: where titles got cut
        browser.open(page)
        clipped = json.loads(browser.evaluate(_CLIPPED))
        errors = list(browser.errors)
    assert errors == [] and clipped == []


def test_the_comparison_puts_eager_and_planned_on_one_scale_in_units_of_the_data(
        tmp_path: Path) -> None:
    from tensorarena.report.compare import write_comparison

    assert BROWSER is not None
    big = random_events(600, seed=4)
    small = [e._replace(nbytes=max(1, e.nbytes // 4)) for e in big[:300]]
    timelines = [timeline_from_events(big, name="eager"),
                 timeline_from_events(small, name="planned")]
    page = tmp_path / "compare.html"
    write_comparison(timelines, ["eager", "planned"], page, heading="gpt2: eager and planned")
    with Browser(BROWSER, width=1000) as browser:
        browser.open(page)
        axes = json.loads(browser.evaluate(
            "JSON.stringify((() => { const l = document.getElementById('compare')._fullLayout;"
            " return [l.yaxis.range, l.yaxis2.range, l.yaxis3.range, l.yaxis4.range,"
            " l.yaxis.title.text, l.xaxis.title.text]; })())"))
        clipped = json.loads(browser.evaluate(_CLIPPED))
        errors = list(browser.errors)
    assert errors == [] and clipped == []
    assert axes[0] == axes[1] and axes[2] == axes[3]  # each row: one scale for both
    # live bytes reach several MiB; the longer call lasts 6,000 µs (10 µs a step)
    assert (axes[4], axes[5]) == ("MiB", "time (µs)")
