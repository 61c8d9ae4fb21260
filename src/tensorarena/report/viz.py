"""The memory timeline as a picture: one self-contained HTML page (plotly) or a PNG (matplotlib).

The page has three charts — live and reserved bytes over time, the block layout of memory over
time (PyTorch memory_viz's active-memory timeline, drawn at the blocks' real positions), and the
top allocation sites — plus a summary table and a note for every aggregation made
(:mod:`tensorarena.report.views`). It needs no network to open: plotly's JavaScript is inlined
in the file once (about 4.6 MB), which is why plotly, a well-kept library, draws the charts
rather than code of ours. Both libraries are optional extras, imported when a picture is asked
for: ``pip install 'tensorarena[viz]'`` (plotly) and ``tensorarena[plot]`` (matplotlib).

Axes are in human units chosen from the data (µs, ms or s; B, KiB, MiB or GiB: :func:`time_unit`,
:func:`byte_unit`). A trace that names its allocators (torch and tensorarena recorded together)
gets one live curve per allocator beside the total. Every block keeps its hover details — site,
allocator, size, stack — however the layout is drawn (:mod:`tensorarena.report.block_hover`).

The chart elements have stable ids (``timeline``, ``layout``, ``sites``, ``block-info``) so a
test in a real browser can find them.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import numpy as np

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError
from tensorarena.report.block_hover import hover_script
from tensorarena.report.timeline import Timeline
from tensorarena.report.views import Views, check_view_options, views
from tensorarena.trace.atomic import atomic_binary

__all__ = ["byte_unit", "render_html", "time_unit", "write_html", "write_png"]

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_CONFIG = {"responsive": True, "displaylogo": False}


def time_unit(timeline: Timeline) -> tuple[float, str]:
    """(trace time units per axis unit, axis title) for the time axis: µs, ms or s by the
    trace's length; the allocation/free number where the trace has no times."""
    if timeline.time_unit != "us":
        return 1.0, "allocation/free number"
    span = float(timeline.end_time - timeline.time[0]) if timeline.steps else 0.0
    if span >= 10e6:
        return 1e6, "time (s)"
    if span >= 10e3:
        return 1e3, "time (ms)"
    return 1.0, "time (µs)"


def byte_unit(nbytes: float) -> tuple[float, str]:
    """(bytes per axis unit, unit name) for an axis whose values reach ``nbytes``."""
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= 2 * scale:
            return float(scale), name
    return 1.0, "B"


def _scales(view: Views, timeline: Timeline) -> tuple[float, str, float, str]:
    tscale, taxis = time_unit(timeline)
    top = float(view.reserved.max()) if view.reserved is not None and view.reserved.size else 0.0
    top = max(top, float(view.live.max()) if view.live.size else 0.0, float(timeline.span))
    bscale, bname = byte_unit(top)
    return tscale, taxis, bscale, bname


def _per_allocator(timeline: Timeline) -> list[tuple[str, np.ndarray]]:
    """Live bytes per step of each named allocator (none when the trace names fewer than
    two): blocks started minus blocks ended by each step's time."""
    named = [(i, name) for i, name in enumerate(timeline.allocators) if name]
    if len(named) < 2 or timeline.block_allocator is None:
        return []
    end = np.where(np.isnan(timeline.block_end), np.inf, timeline.block_end)
    curves = []
    for index, name in named:
        mine = timeline.block_allocator == index
        sizes = timeline.block_size[mine].astype(np.float64)
        order_s, order_e = np.argsort(timeline.block_start[mine]), np.argsort(end[mine])
        started = np.concatenate(([0.0], np.cumsum(sizes[order_s])))
        ended = np.concatenate(([0.0], np.cumsum(sizes[order_e])))
        live = started[np.searchsorted(timeline.block_start[mine][order_s], timeline.time,
                                       side="right")] - \
            ended[np.searchsorted(end[mine][order_e], timeline.time, side="right")]
        curves.append((name, live))
    return curves


def _curves(go: Any, view: Views, timeline: Timeline) -> Any:
    tscale, taxis, bscale, bname = _scales(view, timeline)
    figure = go.Figure()
    figure.add_trace(go.Scatter(x=view.time / tscale, y=view.live / bscale,
                                name="live (allocated)", mode="lines",
                                line={"shape": "hv", "width": 1.5}))
    if view.reserved is not None:
        figure.add_trace(go.Scatter(x=view.time / tscale, y=view.reserved / bscale,
                                    name="reserved", mode="lines",
                                    line={"shape": "hv", "width": 1.5}))
    for name, live in _per_allocator(timeline):
        points = np.linspace(0, live.size, min(live.size, view.time.size), endpoint=False
                             ).astype(np.int64) if live.size else np.zeros(0, np.int64)
        envelope = np.maximum.reduceat(live, points) if live.size else live
        figure.add_trace(go.Scatter(x=timeline.time[points] / tscale, y=envelope / bscale,
                                    name=f"live: {name}", mode="lines",
                                    line={"shape": "hv", "width": 1, "dash": "dot"}))
    figure.add_vline(x=view.peak_time / tscale, line={"dash": "dot", "color": "grey"},
                     annotation_text="peak live")
    figure.update_layout(title="Live and reserved bytes", height=380,
                         xaxis_title=taxis, yaxis_title=bname,
                         margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return figure


def _rectangles(view: Views, tscale: float, bscale: float
                ) -> list[tuple[int, list[float | None], list[float | None]]]:
    """Per colour group (the ten sites with most blocks, then the rest), the outline
    coordinates of every block, ``None`` between blocks."""
    assert view.rectangles is not None
    x0, x1, y0, y1, site = view.rectangles
    common = [int(s) for s in np.argsort(-np.bincount(site))[:len(_COLOURS) - 1]] \
        if site.size else []
    group = np.full(site.size, len(common), dtype=np.int64)
    for rank, value in enumerate(common):
        group[site == value] = rank
    out = []
    for rank in range(len(common) + 1):
        chosen = np.flatnonzero(group == rank)
        if not chosen.size:
            continue
        xs: list[float | None] = []
        ys: list[float | None] = []
        for i in chosen.tolist():
            a, b = float(x0[i]) / tscale, float(x1[i]) / tscale
            c, d = y0[i] / bscale, y1[i] / bscale
            xs += [a, b, b, a, a, None]
            ys += [c, c, d, d, c, None]
        out.append((common[rank] if rank < len(common) else -1, xs, ys))
    return out


def _layout(go: Any, view: Views, timeline: Timeline) -> Any:
    tscale, taxis, bscale, bname = _scales(view, timeline)
    figure = go.Figure()
    if view.rectangles is not None:
        for index, (site, xs, ys) in enumerate(_rectangles(view, tscale, bscale)):
            name = timeline.sites[site] if site >= 0 else "other sites"
            figure.add_trace(go.Scatter(
                x=xs, y=ys, name=name, mode="lines", fill="toself", hoveron="fills",
                line={"width": 0.5, "color": _COLOURS[index % len(_COLOURS)]},
                hoverinfo="name"))
    else:
        assert view.occupancy is not None and view.occupancy_edges is not None
        assert view.occupancy_time is not None
        centres = (view.occupancy_edges[:-1] + view.occupancy_edges[1:]) / 2 / bscale
        figure.add_trace(go.Heatmap(z=view.occupancy.T, x=view.occupancy_time / tscale,
                                    y=centres, zmin=0, zmax=1, colorscale="Viridis",
                                    colorbar={"title": "in use"}))
    figure.update_layout(title="Block layout over time (point at a block for its details)",
                         height=460, xaxis_title=taxis,
                         yaxis_title=f"position in memory ({bname}; arenas end to end)",
                         margin={"l": 60, "r": 20, "t": 60, "b": 50})
    return figure


def _sites(go: Any, view: Views) -> Any:
    # Two panels, not one grouped chart: bytes allocated in all can be a thousand times the
    # bytes live at the peak, and would flatten the bars that matter.
    from plotly.subplots import make_subplots

    names = [name if len(name) <= 60 else name[:57] + "..." for name in view.site_names][::-1]
    peak_scale, peak_unit = byte_unit(float(view.site_peak.max()) if view.site_peak.size else 0)
    total_scale, total_unit = byte_unit(float(view.site_total.max())
                                        if view.site_total.size else 0)
    figure = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                           subplot_titles=(f"live at the peak ({peak_unit})",
                                           f"allocated in all ({total_unit})"))
    figure.add_trace(go.Bar(y=names, x=view.site_peak[::-1] / peak_scale, orientation="h",
                            name="live at the peak"), row=1, col=1)
    figure.add_trace(go.Bar(y=names, x=view.site_total[::-1] / total_scale, orientation="h",
                            name="allocated in all"), row=1, col=2)
    figure.update_layout(title="Top allocation sites", showlegend=False,
                         height=max(300, 80 + 36 * len(names)),
                         margin={"l": 20, "r": 20, "t": 80, "b": 40})
    figure.update_yaxes(automargin=True)
    return figure


def render_html(timeline: Timeline, **options: Any) -> str:
    """The page for ``timeline`` as a string (``options`` go to :func:`views`)."""
    check_view_options(**options)
    require("plotly", extra="viz", feature="the HTML memory timeline")
    import plotly.graph_objects as go
    import plotly.io as pio

    view = views(timeline, **options)
    figures = [("timeline", _curves(go, view, timeline)), ("layout", _layout(go, view, timeline)),
               ("sites", _sites(go, view))]
    parts = [pio.to_html(figure, full_html=False, include_plotlyjs=index == 0, div_id=name,
                         config=_CONFIG)
             for index, (name, figure) in enumerate(figures)]
    tscale, _, bscale, _ = _scales(view, timeline)
    parts[1] += hover_script(timeline, time_scale=tscale, byte_scale=bscale)
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                   for k, v in view.summary)
    notes = "".join(f"<p class='note'>{html.escape(note)}</p>" for note in view.notes)
    title = html.escape(f"Memory timeline: {timeline.name}")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px}"
        "th{text-align:left;padding-right:1.5em;font-weight:600}td{font-family:monospace}"
        ".note{color:#555;font-size:0.95em}</style></head><body>"
        f"<h1>{title}</h1><table id='summary'>{rows}</table>{notes}"
        + "".join(f"<section>{part}</section>" for part in parts)
        + "<p class='note'>Made by tensorarena viz.</p></body></html>\n"
    )


def write_html(timeline: Timeline, path: str | os.PathLike[str], **options: Any) -> None:
    """Write the self-contained page for ``timeline`` to ``path`` (atomically)."""
    page = render_html(timeline, **options).encode("utf-8")
    with atomic_binary(Path(path)) as handle:
        handle.write(page)


def write_png(timeline: Timeline, path: str | os.PathLike[str], *, dpi: int = 110,
              **options: Any) -> None:
    """Write the same three charts as one matplotlib picture to ``path``."""
    check_view_options(**options)
    if isinstance(dpi, bool) or not isinstance(dpi, int | float) or not dpi > 0:
        raise InvalidArgumentError(f"dpi must be a positive number, not {dpi!r}")
    require("matplotlib", extra="plot", feature="the PNG memory timeline")
    from matplotlib import collections, patches
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    view = views(timeline, **options)
    figure = Figure(figsize=(12, 12), layout="constrained")
    FigureCanvasAgg(figure)
    rows: Any = figure.subfigures(3, 1, height_ratios=[1, 1.3, 0.9])
    top = rows[0].subplots()
    middle = rows[1].subplots()
    peak_axis, total_axis = rows[2].subplots(1, 2, sharey=True)
    tscale, taxis, bscale, bname = _scales(view, timeline)
    top.step(view.time / tscale, view.live / bscale, where="post", label="live (allocated)")
    if view.reserved is not None:
        top.step(view.time / tscale, view.reserved / bscale, where="post", label="reserved")
    for name, live in _per_allocator(timeline):
        top.step(timeline.time / tscale, live / bscale, where="post", label=f"live: {name}",
                 linestyle=":")
    top.axvline(view.peak_time / tscale, color="grey", linestyle=":")
    top.set(title=f"Memory timeline: {timeline.name}", xlabel=taxis, ylabel=bname)
    top.legend(loc="upper left")
    if view.rectangles is not None:
        x0, x1, y0, y1, site = view.rectangles
        verts = [((a, c), (b, c), (b, d), (a, d))
                 for a, b, c, d in zip((x0 / tscale).tolist(), (x1 / tscale).tolist(),
                                       (y0 / bscale).tolist(), (y1 / bscale).tolist(),
                                       strict=True)]
        colours = [_COLOURS[int(s) % len(_COLOURS)] for s in site.tolist()]
        middle.add_collection(collections.PolyCollection(verts, facecolors=colours,
                                                         edgecolors="none"))
        middle.autoscale_view()
        shown = sorted(set(site.tolist()))[: len(_COLOURS)]
        handles = [patches.Patch(color=_COLOURS[s % len(_COLOURS)], label=timeline.sites[s][:40])
                   for s in shown]
        middle.legend(handles=handles, loc="upper left", fontsize=7)
    else:
        assert view.occupancy is not None and view.occupancy_time is not None
        assert view.occupancy_edges is not None
        extent = (float(view.occupancy_time[0]) / tscale, float(view.occupancy_time[-1]) / tscale,
                  0.0, float(view.occupancy_edges[-1]) / bscale)
        image = middle.imshow(view.occupancy.T, origin="lower", aspect="auto", extent=extent,
                              vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
        rows[1].colorbar(image, ax=middle, label="in use")
    middle.set(title="Block layout over time", xlabel=taxis,
               ylabel=f"position in memory ({bname})")
    positions = np.arange(len(view.site_names))
    peak_scale, peak_unit = byte_unit(float(view.site_peak.max()) if view.site_peak.size else 0)
    total_scale, total_unit = byte_unit(float(view.site_total.max())
                                        if view.site_total.size else 0)
    peak_axis.barh(positions, view.site_peak / peak_scale, color=_COLOURS[0])
    total_axis.barh(positions, view.site_total / total_scale, color=_COLOURS[1])
    peak_axis.set_yticks(positions,
                         [n if len(n) <= 50 else n[:47] + "..." for n in view.site_names])
    peak_axis.invert_yaxis()
    peak_axis.set(title="Top allocation sites: live at the peak", xlabel=peak_unit)
    total_axis.set(title="allocated in all", xlabel=total_unit)
    if view.notes:
        figure.supxlabel("\n".join(view.notes), fontsize=7, color="#555")
    with atomic_binary(Path(path)) as handle:
        figure.savefig(handle, format="png", dpi=dpi)
