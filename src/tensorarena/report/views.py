"""What a picture of a :class:`~tensorarena.report.timeline.Timeline` shows, computed once with
NumPy and drawn by either renderer (the HTML page and the PNG): a picture of 10^6 events must
not hand 10^6 points to a browser, so large timelines are aggregated here, and every view says
how (:attr:`Views.notes`, printed on the page).

* Curves: live and reserved bytes per step. Above ``max_points`` steps they are cut into
  ``max_points`` runs of consecutive steps and each run drawn as its *maximum* — the envelope
  keeps every peak, which is what a memory curve is read for.
* Layout: each block as a rectangle (time × position in memory) while there are at most
  ``max_blocks``; above that an occupancy map: at ``time_samples`` instants, the fraction of each
  of ``address_bins`` bands of memory that live blocks cover. The band sums are exact (the
  integral of the block intervals over each band, from sorted starts and ends), only time is
  sampled.
* Sites: bytes live at the peak and bytes allocated in all, per allocation site, the largest
  ``top_sites``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensorarena.errors import InvalidArgumentError
from tensorarena.report.timeline import Timeline
from tensorarena.sizes import format_size

__all__ = ["Views", "check_view_options", "views"]

#: Each option of :func:`views` and the least value it takes.
_LEAST = {"max_points": 2, "max_blocks": 0, "time_samples": 2, "address_bins": 1, "top_sites": 1}


def check_view_options(**options: object) -> None:
    """Raise :class:`~tensorarena.errors.InvalidArgumentError` for an option :func:`views`
    does not take, or a value out of its range (the renderers check before they import)."""
    for name, value in options.items():
        if name not in _LEAST:
            raise InvalidArgumentError(
                f"unknown view option {name!r}; expected one of {', '.join(_LEAST)}"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < _LEAST[name]:
            raise InvalidArgumentError(
                f"{name} must be an int of at least {_LEAST[name]}, not {value!r}"
            )


@dataclass(frozen=True, eq=False)
class Views:
    """The data of the three charts, ready to draw."""

    time: np.ndarray  #: x of the curves
    live: np.ndarray
    reserved: np.ndarray | None
    downsampled: int  #: steps per point of the curves (1: every step)
    rectangles: tuple[np.ndarray, ...] | None  #: (x0, x1, y0, y1, site) per block, or None
    occupancy: np.ndarray | None  #: [time sample, address band] fractions, or None
    occupancy_time: np.ndarray | None
    occupancy_edges: np.ndarray | None  #: band edges in bytes on the memory axis
    site_names: tuple[str, ...]  #: the top sites, most bytes at the peak first
    site_peak: np.ndarray
    site_total: np.ndarray
    peak_time: float
    notes: tuple[str, ...]
    summary: tuple[tuple[str, str], ...]


def _envelope(time: np.ndarray, values: np.ndarray, points: int) -> tuple[np.ndarray, ...]:
    if values.size <= points:
        return time, values
    starts = np.linspace(0, values.size, points, endpoint=False).astype(np.int64)
    return time[starts], np.maximum.reduceat(values, starts)


def _band_cover(y0: np.ndarray, y1: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """For each band ``[edges[i], edges[i+1])``, the bytes the intervals ``[y0, y1)`` cover:
    G(x) = sum over intervals of clip(x - y0, 0, y1 - y0), differenced at the edges."""
    def ramp_sum(points: np.ndarray, x: np.ndarray) -> np.ndarray:
        ordered = np.sort(points)
        prefix = np.concatenate(([0.0], np.cumsum(ordered, dtype=np.float64)))
        count = np.searchsorted(ordered, x, side="left")
        result: np.ndarray = count * x - prefix[count]
        return result

    cover = ramp_sum(y0, edges) - ramp_sum(y1, edges)
    return np.diff(cover)


def _occupancy(timeline: Timeline, y0: np.ndarray, y1: np.ndarray, samples: int,
               bands: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    start, end = timeline.time[0], timeline.end_time
    when = np.linspace(start, end, samples) if end > start else np.full(samples, start)
    edges = np.linspace(0, max(timeline.span, 1), bands + 1)
    widths = np.diff(edges)
    block_end = np.where(np.isnan(timeline.block_end), np.inf, timeline.block_end)
    grid = np.zeros((samples, bands))
    for row, t in enumerate(when):
        alive = (timeline.block_start <= t) & (block_end > t)
        if alive.any():
            grid[row] = _band_cover(y0[alive], y1[alive], edges) / widths
    return np.clip(grid, 0, 1), when, edges


def views(timeline: Timeline, *, max_points: int = 2000, max_blocks: int = 2000,
          time_samples: int = 300, address_bins: int = 200, top_sites: int = 12) -> Views:
    """Everything the renderers draw for ``timeline`` (see the module docstring)."""
    check_view_options(max_points=max_points, max_blocks=max_blocks, time_samples=time_samples,
                       address_bins=address_bins, top_sites=top_sites)
    notes: list[str] = []
    time, live = _envelope(timeline.time, timeline.live, max_points)
    reserved = None
    if timeline.reserved is not None:
        reserved = _envelope(timeline.time, timeline.reserved, max_points)[1]
    per_point = max(1, -(-timeline.steps // max_points))
    if per_point > 1:
        notes.append(
            f"{timeline.steps:,} allocations and frees: each point of the curves is the maximum "
            f"over about {per_point:,} consecutive ones ({len(time):,} points), so every peak "
            "is kept."
        )
    y0 = timeline.offsets(timeline.block_address).astype(np.float64)
    y1 = y0 + timeline.block_size
    end = np.where(np.isnan(timeline.block_end), timeline.end_time, timeline.block_end)
    rectangles = occupancy = occupancy_time = edges = None
    if timeline.blocks <= max_blocks:
        rectangles = (timeline.block_start, end, y0, y1, timeline.block_site)
    else:
        occupancy, occupancy_time, edges = _occupancy(timeline, y0, y1, time_samples,
                                                      address_bins)
        notes.append(
            f"{timeline.blocks:,} blocks: the layout shows, at {time_samples} instants, the "
            f"fraction of each of {address_bins} bands of memory "
            f"({format_size(int(edges[1] - edges[0]))} each) that live blocks cover, instead "
            "of one rectangle per block."
        )
    peak = timeline.peak_index
    alive = timeline.live_at(peak) if timeline.steps else np.zeros(0, dtype=bool)
    count = len(timeline.sites)
    at_peak = np.bincount(timeline.block_site[alive], weights=timeline.block_size[alive],
                          minlength=count)
    total = np.bincount(timeline.block_site, weights=timeline.block_size, minlength=count)
    order = np.lexsort((-total, -at_peak))[:top_sites]
    if count > top_sites:
        notes.append(f"{count} allocation sites: the {top_sites} with the most bytes live at "
                     "the peak are shown.")
    unit = "µs" if timeline.time_unit == "us" else "allocation/free number"
    peak_reserved = int(timeline.reserved.max()) if timeline.reserved is not None and \
        timeline.reserved.size else None
    summary = [
        ("source", f"{timeline.name} ({timeline.source})"),
        ("allocations and frees", f"{timeline.steps:,}"),
        ("blocks", f"{timeline.blocks:,}"),
        ("peak live", format_size(int(timeline.live.max())) if timeline.steps else "0 B"),
        ("peak reserved", "unknown" if peak_reserved is None else format_size(peak_reserved)),
        ("live at the end", format_size(int(timeline.live[-1])) if timeline.steps else "0 B"),
        ("time axis", unit),
    ]
    return Views(
        time=time,
        live=live,
        reserved=reserved,
        downsampled=per_point,
        rectangles=rectangles,
        occupancy=occupancy,
        occupancy_time=occupancy_time,
        occupancy_edges=edges,
        site_names=tuple(timeline.sites[i] for i in order),
        site_peak=at_peak[order],
        site_total=total[order],
        peak_time=float(timeline.time[peak]) if timeline.steps else 0.0,
        notes=tuple(notes),
        summary=tuple(summary),
    )
