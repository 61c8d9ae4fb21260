"""Per-block hover for the HTML timeline, whatever was aggregated in the drawing.

Above ``max_blocks`` the layout chart is an occupancy map (:mod:`tensorarena.report.views`): the
*drawing* is aggregated so that a browser is not handed a shape per block. The *data* is not:
:func:`hover_script` embeds every block once — start and end times, position and size in
memory, site label, allocator and Python stack, as base64 typed arrays (16 to 28 bytes a block:
arrays of zeros are not sent) and three string tables — with a small script that, as the pointer
moves over the layout chart, finds the blocks under it (a linear scan: a few milliseconds for
10^6 blocks, at most once per animation frame) and shows the smallest one's details in
``#block-info``. The same script serves the rectangle drawing, whose shapes are filled outlines
that plotly can only label by group.
"""

from __future__ import annotations

import base64
import json

import numpy as np

from tensorarena.report.timeline import Timeline

__all__ = ["hover_script"]


def _b64(array: np.ndarray, dtype: str) -> str | None:
    """The array as base64 of ``dtype``; None for an array of zeros (sent as nothing)."""
    if dtype.startswith("<i") and not np.any(array):
        return None
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def _data(timeline: Timeline, time_scale: float, byte_scale: float) -> dict[str, object]:
    # Times relative to the first one and positions as float32: 16 bytes a block for the four,
    # exact to a microsecond over 16 s and to 1 part in 10^7 of the memory axis, which is what a
    # hover shows; the lookup compares in the same precision, so it finds the block drawn.
    origin = float(timeline.time[0]) if timeline.steps else 0.0
    y0 = timeline.offsets(timeline.block_address).astype(np.float64)
    end = np.where(np.isnan(timeline.block_end), timeline.end_time, timeline.block_end)
    count = timeline.blocks
    allocator = timeline.block_allocator if timeline.block_allocator is not None else \
        np.zeros(count, dtype=np.int32)
    stack = timeline.block_stack if timeline.block_stack is not None else \
        np.zeros(count, dtype=np.int32)
    return {
        "origin": origin, "count": count,
        "start": _b64(timeline.block_start - origin, "<f4"), "end": _b64(end - origin, "<f4"),
        "y0": _b64(y0, "<f4"), "size": _b64(timeline.block_size, "<f4"),
        "site": _b64(timeline.block_site, "<i4"), "allocator": _b64(allocator, "<i4"),
        "stack": _b64(stack, "<i4"), "sites": list(timeline.sites),
        "allocators": list(timeline.allocators), "stacks": list(timeline.stacks),
        "unit": "us" if timeline.time_unit == "us" else "action",
        "xscale": time_scale, "yscale": byte_scale,
    }


# The chart's axes are in display units (ms, MiB...): xscale and yscale turn them back into the
# data's (the trace's time unit, bytes).
_SCRIPT = r"""
(function () {
  const data = JSON.parse(document.getElementById('block-data').textContent);
  const count = data.count;
  const typed = (text, Type) => {
    if (text === null) return new Type(count);  // all zeros: not sent
    const bytes = Uint8Array.from(atob(text), c => c.charCodeAt(0));
    return new Type(bytes.buffer);
  };
  const start = typed(data.start, Float32Array), end = typed(data.end, Float32Array);
  const y0 = typed(data.y0, Float32Array), size = typed(data.size, Float32Array);
  const site = typed(data.site, Int32Array), allocator = typed(data.allocator, Int32Array);
  const stack = typed(data.stack, Int32Array);
  const info = document.getElementById('block-info');
  const bytes = n => {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i ? n.toFixed(n < 10 ? 2 : 1) : String(n)) + ' ' + units[i];
  };
  const when = t => data.unit !== 'us' ? '#' + t :
    t >= 1e6 ? (t / 1e6).toFixed(3) + ' s' : t >= 1e3 ? (t / 1e3).toFixed(3) + ' ms' : t + ' µs';
  window.tensorarenaBlockAt = function (x, y) {
    x -= data.origin;
    let best = -1;
    for (let i = 0; i < start.length; i += 1) {
      if (start[i] <= x && x <= end[i] && y0[i] <= y && y < y0[i] + size[i]
          && (best < 0 || size[i] < size[best])) best = i;
    }
    return best;
  };
  window.tensorarenaDescribe = function (i) {
    if (i < 0) return '';
    const lines = [data.sites[site[i]] + (data.allocators[allocator[i]] ?
      ' · ' + data.allocators[allocator[i]] : ''),
      bytes(size[i]) + ' at ' + bytes(y0[i]) + ', live from ' + when(start[i] + data.origin) +
      ' to ' + when(end[i] + data.origin)];
    const frames = data.stacks[stack[i]];
    if (frames) lines.push(...frames.split('; ').slice(0, 8).map(f => '  ' + f));
    return lines.join('\n');
  };
  const chart = document.getElementById('layout');
  let pending = null;
  chart.addEventListener('mousemove', event => {
    pending = event;
    requestAnimationFrame(() => {
      if (pending === null) return;
      const e = pending; pending = null;
      const layer = chart.querySelector('.nsewdrag');
      if (!layer || !chart._fullLayout) return;
      const box = layer.getBoundingClientRect();
      const xa = chart._fullLayout.xaxis, ya = chart._fullLayout.yaxis;
      const x = xa.p2d(e.clientX - box.left) * data.xscale;
      const y = ya.p2d(e.clientY - box.top) * data.yscale;
      info.textContent = window.tensorarenaDescribe(window.tensorarenaBlockAt(x, y)) ||
        'no block here';
    });
  });
})();
"""


def hover_script(timeline: Timeline, *, time_scale: float = 1.0, byte_scale: float = 1.0) -> str:
    """The HTML (a data block, the info box and the script) that goes after the layout chart,
    whose x axis is ``time_scale`` trace time units per unit and y axis ``byte_scale`` bytes."""
    payload = json.dumps(_data(timeline, time_scale, byte_scale)).replace("</", "<\\/")
    return (f"<pre id='block-info' class='note'>Point at a block in the layout chart for its "
            f"site, allocator, size and stack.</pre>"
            f"<script type='application/json' id='block-data'>{payload}</script>"
            f"<script>{_SCRIPT}</script>")
