"""The memory timeline as a picture: one self-contained HTML page (plotly) or a PNG (matplotlib).

The page has three charts — live and reserved bytes over time, the block layout of memory over
time (PyTorch memory_viz's active-memory timeline, drawn at the blocks' real positions), and the
top allocation sites — plus a summary table and a note for every aggregation made
(:mod:`tensorarena.report.views`). It needs no network to open: plotly's JavaScript is inlined
in the file once (about 4.6 MB), which is why plotly, a well-kept library, draws the charts
rather than code of ours. Both libraries are optional extras, imported when a picture is asked
for: ``pip install 'tensorarena[viz]'`` (plotly) and ``tensorarena[plot]`` (matplotlib).

The chart elements have stable ids (``timeline``, ``layout``, ``sites``) so a test in a real
browser can find them.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import numpy as np

from tensorarena._optional import require
from tensorarena.errors import InvalidArgumentError
from tensorarena.report.timeline import Timeline
from tensorarena.report.views import Views, check_view_options, views
from tensorarena.trace.atomic import atomic_binary

__all__ = ["render_html", "write_html", "write_png"]

_MIB = float(1 << 20)
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_CONFIG = {"responsive": True, "displaylogo": False}


def _axis(unit: str) -> str:
    return "time (µs)" if unit == "us" else "allocation/free number"


def _curves(go: Any, view: Views, timeline: Timeline) -> Any:
    figure = go.Figure()
    figure.add_trace(go.Scatter(x=view.time, y=view.live / _MIB, name="live (allocated)",
                                mode="lines", line={"shape": "hv", "width": 1.5}))
    if view.reserved is not None:
        figure.add_trace(go.Scatter(x=view.time, y=view.reserved / _MIB, name="reserved",
                                    mode="lines", line={"shape": "hv", "width": 1.5}))
    figure.add_vline(x=view.peak_time, line={"dash": "dot", "color": "grey"},
                     annotation_text="peak live")
    figure.update_layout(title="Live and reserved bytes", height=380,
                         xaxis_title=_axis(timeline.time_unit), yaxis_title="MiB",
                         margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return figure


def _rectangles(view: Views) -> list[tuple[int, list[float | None], list[float | None]]]:
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
            a, b, c, d = float(x0[i]), float(x1[i]), y0[i] / _MIB, y1[i] / _MIB
            xs += [a, b, b, a, a, None]
            ys += [c, c, d, d, c, None]
        out.append((common[rank] if rank < len(common) else -1, xs, ys))
    return out


def _layout(go: Any, view: Views, timeline: Timeline) -> Any:
    figure = go.Figure()
    if view.rectangles is not None:
        for index, (site, xs, ys) in enumerate(_rectangles(view)):
            name = timeline.sites[site] if site >= 0 else "other sites"
            figure.add_trace(go.Scatter(
                x=xs, y=ys, name=name, mode="lines", fill="toself", hoveron="fills",
                line={"width": 0.5, "color": _COLOURS[index % len(_COLOURS)]},
                hoverinfo="name"))
    else:
        assert view.occupancy is not None and view.occupancy_edges is not None
        centres = (view.occupancy_edges[:-1] + view.occupancy_edges[1:]) / 2 / _MIB
        figure.add_trace(go.Heatmap(z=view.occupancy.T, x=view.occupancy_time, y=centres,
                                    zmin=0, zmax=1, colorscale="Viridis",
                                    colorbar={"title": "in use"}))
    figure.update_layout(title="Block layout over time", height=460,
                         xaxis_title=_axis(timeline.time_unit),
                         yaxis_title="position in memory (MiB; arenas end to end)",
                         margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return figure


def _sites(go: Any, view: Views) -> Any:
    # Two panels, not one grouped chart: bytes allocated in all can be a thousand times the
    # bytes live at the peak, and would flatten the bars that matter.
    from plotly.subplots import make_subplots

    names = [name if len(name) <= 60 else name[:57] + "..." for name in view.site_names][::-1]
    figure = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                           subplot_titles=("live at the peak (MiB)", "allocated in all (MiB)"))
    figure.add_trace(go.Bar(y=names, x=view.site_peak[::-1] / _MIB, orientation="h",
                            name="live at the peak"), row=1, col=1)
    figure.add_trace(go.Bar(y=names, x=view.site_total[::-1] / _MIB, orientation="h",
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
    top.step(view.time, view.live / _MIB, where="post", label="live (allocated)")
    if view.reserved is not None:
        top.step(view.time, view.reserved / _MIB, where="post", label="reserved")
    top.axvline(view.peak_time, color="grey", linestyle=":")
    top.set(title=f"Memory timeline: {timeline.name}", xlabel=_axis(timeline.time_unit),
            ylabel="MiB")
    top.legend(loc="upper left")
    if view.rectangles is not None:
        x0, x1, y0, y1, site = view.rectangles
        verts = [((a, c), (b, c), (b, d), (a, d))
                 for a, b, c, d in zip(x0.tolist(), x1.tolist(), (y0 / _MIB).tolist(),
                                       (y1 / _MIB).tolist(), strict=True)]
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
        extent = (float(view.occupancy_time[0]), float(view.occupancy_time[-1]), 0.0,
                  float(view.occupancy_edges[-1]) / _MIB)
        image = middle.imshow(view.occupancy.T, origin="lower", aspect="auto", extent=extent,
                              vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
        rows[1].colorbar(image, ax=middle, label="in use")
    middle.set(title="Block layout over time", xlabel=_axis(timeline.time_unit),
               ylabel="position in memory (MiB)")
    positions = np.arange(len(view.site_names))
    peak_axis.barh(positions, view.site_peak / _MIB, color=_COLOURS[0])
    total_axis.barh(positions, view.site_total / _MIB, color=_COLOURS[1])
    peak_axis.set_yticks(positions,
                         [n if len(n) <= 50 else n[:47] + "..." for n in view.site_names])
    peak_axis.invert_yaxis()
    peak_axis.set(title="Top allocation sites: live at the peak", xlabel="MiB")
    total_axis.set(title="allocated in all", xlabel="MiB")
    if view.notes:
        figure.supxlabel("\n".join(view.notes), fontsize=7, color="#555")
    with atomic_binary(Path(path)) as handle:
        figure.savefig(handle, format="png", dpi=dpi)
