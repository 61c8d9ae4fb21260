"""Two or more memory timelines side by side on one scale: the demo's eager call beside its planned
call, or any runs to compare.

One plotly figure, a column per timeline: live and reserved bytes on top, the block layout below.
Every panel of a row shares its y axis (the same bytes at the same height: a smaller planned peak
*looks* smaller) and every time axis the same unit (each run from its own start). Units come
from the data (:func:`~tensorarena.report.viz.time_unit`, :func:`~tensorarena.report.viz.byte_unit`
over all the timelines). A table gives each run's peak live, peak reserved and block count.
The table says where each run's addresses come from (a snapshot's own, or a trace replayed on a
pool), since reserved bytes mean that allocator's. The figure's id is ``compare``; titles get
their own margin so none is clipped.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError
from tensorarena.report.timeline import Timeline
from tensorarena.report.views import views
from tensorarena.report.viz import byte_unit, time_unit
from tensorarena.sizes import format_size
from tensorarena.trace.atomic import atomic_binary

__all__ = ["render_comparison", "write_comparison"]

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _scales(timelines: Sequence[Timeline]) -> tuple[float, str, float, str]:
    longest = max(timelines, key=lambda t: float(t.end_time - t.time[0]) if t.steps else 0.0)
    tscale, taxis = time_unit(longest)
    top = max(max(float(t.live.max()) if t.steps else 0.0,
                  float(t.reserved.max()) if t.reserved is not None and t.reserved.size else 0.0,
                  float(t.span)) for t in timelines)
    bscale, bname = byte_unit(top)
    return tscale, taxis, bscale, bname


def _add_layout(go: Any, figure: Any, timeline: Timeline, column: int, tscale: float,
                bscale: float, max_blocks: int) -> None:
    view = views(timeline, max_blocks=max_blocks)
    origin = float(timeline.time[0]) if timeline.steps else 0.0
    if view.rectangles is not None:  # one shape per block, a colour per site (the top ones)
        x0, x1, y0, y1, site = view.rectangles
        common = [int(v) for v in np.argsort(-np.bincount(site))[:len(_COLOURS) - 1]] \
            if site.size else []
        for rank in range(len(common) + 1):
            chosen = np.flatnonzero(site == common[rank]) if rank < len(common) else \
                np.flatnonzero(~np.isin(site, common))
            if not chosen.size:
                continue
            xs: list[float | None] = []
            ys: list[float | None] = []
            for i in chosen.tolist():
                a, b = (float(x0[i]) - origin) / tscale, (float(x1[i]) - origin) / tscale
                c, d = y0[i] / bscale, y1[i] / bscale
                xs += [a, b, b, a, a, None]
                ys += [c, c, d, d, c, None]
            name = timeline.sites[common[rank]] if rank < len(common) else "other sites"
            figure.add_trace(go.Scatter(x=xs, y=ys, mode="lines", fill="toself", name=name,
                                        showlegend=False, hoveron="fills", hoverinfo="name",
                                        line={"width": 0.5, "color": _COLOURS[rank]}),
                             row=2, col=column)
    else:
        assert view.occupancy is not None and view.occupancy_edges is not None
        assert view.occupancy_time is not None
        centres = (view.occupancy_edges[:-1] + view.occupancy_edges[1:]) / 2 / bscale
        figure.add_trace(go.Heatmap(z=view.occupancy.T, x=(view.occupancy_time - origin) / tscale,
                                    y=centres, zmin=0, zmax=1, colorscale="Viridis",
                                    showscale=column == 1, colorbar={"title": "in use"}),
                         row=2, col=column)


def _peak(values: np.ndarray | None) -> str:
    return "unknown" if values is None or not values.size else format_size(int(values.max()))


def render_comparison(timelines: Sequence[Timeline], titles: Sequence[str], *,
                      heading: str = "Memory, side by side", max_blocks: int = 2000) -> str:
    """The page comparing ``timelines`` (each named by its title) as a string."""
    if not timelines or len(titles) != len(timelines):
        raise InvalidArgumentError("give one title per timeline, and at least one timeline")
    require("plotly", extra="viz", feature="the HTML memory comparison")
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    tscale, taxis, bscale, bname = _scales(timelines)
    count = len(timelines)
    figure = make_subplots(
        rows=2, cols=count, shared_yaxes="rows", horizontal_spacing=0.06, vertical_spacing=0.14,
        subplot_titles=[f"{t}: live and reserved" for t in titles]
        + [f"{t}: block layout" for t in titles])
    for column, timeline in enumerate(timelines, 1):
        origin = float(timeline.time[0]) if timeline.steps else 0.0
        x = (timeline.time - origin) / tscale
        figure.add_trace(go.Scatter(x=x, y=timeline.live / bscale, mode="lines",
                                    name="live", legendgroup="live", showlegend=column == 1,
                                    line={"shape": "hv", "color": _COLOURS[0]}),
                         row=1, col=column)
        if timeline.reserved is not None:
            figure.add_trace(go.Scatter(x=x, y=timeline.reserved / bscale, mode="lines",
                                        name="reserved", legendgroup="reserved",
                                        showlegend=column == 1,
                                        line={"shape": "hv", "color": _COLOURS[1]}),
                             row=1, col=column)
        _add_layout(go, figure, timeline, column, tscale, bscale, max_blocks)
        figure.update_xaxes(title_text=taxis, row=1, col=column)
        figure.update_xaxes(title_text=taxis, row=2, col=column)
    figure.update_yaxes(title_text=bname, row=1, col=1)
    figure.update_yaxes(title_text=f"position ({bname})", row=2, col=1)
    # The heading is the page's <h1>: a figure title above the subplot titles was cut off.
    figure.update_layout(height=860, margin={"l": 70, "r": 30, "t": 80, "b": 60},
                         legend={"orientation": "h", "y": 1.1, "x": 1, "xanchor": "right"})
    chart = pio.to_html(figure, full_html=False, include_plotlyjs=True, div_id="compare",
                        config={"responsive": True, "displaylogo": False})
    rows = "".join(f"<tr><th>{html.escape(title)}</th><td>{_peak(t.live)}</td>"
                   f"<td>{_peak(t.reserved)}</td><td>{t.blocks:,}</td>"
                   f"<td>{html.escape(t.source)}</td></tr>"
                   for title, t in zip(titles, timelines, strict=True))
    title = html.escape(heading)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1600px}"
        "th,td{text-align:left;padding-right:1.5em}td{font-family:monospace}</style></head>"
        f"<body><h1>{title}</h1><table id='summary'><tr><th></th><th>peak live</th>"
        f"<th>peak reserved</th><th>blocks</th><th>addresses from</th></tr>{rows}</table>"
        "<p>Each row of charts shares one scale: the same bytes at the same height. Time runs "
        "from each call's own start.</p>"
        f"<section>{chart}</section><p>Made by tensorarena.</p></body></html>\n"
    )


def write_comparison(timelines: Sequence[Timeline], titles: Sequence[str],
                     path: str | os.PathLike[str], **options: Any) -> None:
    """Write :func:`render_comparison`'s page to ``path`` (atomically)."""
    page = render_comparison(timelines, titles, **options).encode("utf-8")
    with atomic_binary(Path(path)) as handle:
        handle.write(page)
