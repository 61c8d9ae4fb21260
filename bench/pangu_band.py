"""Probe: close the hole at pangu_2.6B's peak tick as a band, then one exact search in a byte band.

Issue 26 (target ≤ 1.002 x the lower bound). Not a planner: a script of the library's public
pieces, to record how a plan at the target was first reached, with pangu's constants; the
planner step with general rules and a work budget is ``planning/band_repair.py`` (``auto`` and
``plan(..., repair=True)``). Steps, each printed with its height:

1. ``long_lived_first`` (the stage ``auto`` ends with on this trace).
2. Band removal: the largest hole in the stack of buffers live at the peak tick is cut out as a
   horizontal band; every buffer above it moves down by its height, the buffers that meet its
   bytes at other ticks are placed again by ``greedy_size`` with everything else pinned.
3. The buffers still above the target (``--target`` x the bound) are placed by one exact search
   over a byte band ``[low, high)``: free are those buffers plus every buffer wholly inside the
   band, alive within ``--margin`` ticks of them and at most ``--max-life`` ticks long; every other
   buffer that meets the band at their ticks is pinned (clipped to the band). The band is, unless
   given, from the lowest to the highest hole (below the bound) at those ticks.

The full plan is checked by the independent validator.

    .venv/bin/python bench/pangu_band.py [--data DIR] [--time-limit 30] [--nodes 20000]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import numpy as np

from tensorarena.bench.plan import data_folder
from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.heuristics import HEURISTICS
from tensorarena.planning.long_lived_first import long_lived_first
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.validate import validate

TRACE = "somas_tensors/pangu_2.6B.csv"


def holes_at(tick, s, e, z, o, top):
    """(bottom, top) of every free gap below ``top`` in the stack of buffers live at ``tick``."""
    live = np.flatnonzero((s <= tick) & (e > tick) & (z > 0) & (o + z <= top))
    gaps, cur = [], 0
    for i in live[np.argsort(o[live], kind="stable")]:
        if o[i] > cur:
            gaps.append((cur, int(o[i])))
        cur = max(cur, int(o[i] + z[i]))
    if cur < top:
        gaps.append((cur, top))
    return gaps


def replace(buffers, free, o):
    """``o`` with the ``free`` buffers placed again by greedy_size, every other one pinned."""
    mask = np.zeros(len(buffers), bool)
    mask[free] = True
    pinned = Problem([Buffer(b.id, b.start, b.end, b.nbytes, b.alignment,
                             None if mask[k] else int(o[k])) for k, b in enumerate(buffers)])
    return np.array(HEURISTICS["greedy_size"](pinned).offsets, dtype=np.int64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--trace", default=TRACE, help="under idealloc/ in the data folder")
    ap.add_argument("--time-limit", type=float, default=30.0, help="for long_lived_first")
    ap.add_argument("--target", type=float, default=1.002)
    ap.add_argument("--margin", type=int, default=4)
    ap.add_argument("--max-life", type=int, default=14000)
    ap.add_argument("--low", type=float, default=None, help="band bottom, x bound")
    ap.add_argument("--high", type=float, default=None, help="band top, x bound")
    ap.add_argument("--nodes", type=int, default=20_000, help="per band")
    args = ap.parse_args()
    path = data_folder(args.data) / "idealloc" / args.trace
    if not path.exists():
        print(f"skipped: {path} not found")
        return 0
    print(f"python {platform.python_version()}, {platform.machine()}")
    p = read_problem(str(path))
    bufs = p.buffers
    s = np.array([b.start for b in bufs])
    e = np.array([b.end for b in bufs])
    z = np.array([b.nbytes for b in bufs])
    lb = p.lower_bound()
    target = int(lb * args.target)
    t = time.perf_counter()
    o = np.array(long_lived_first(p, time_limit=args.time_limit).offsets, dtype=np.int64)
    print(f"1 long_lived_first: {(o + z).max() / lb:.5f} x bound, {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    load = np.zeros(int(e.max()) + 2, np.int64)
    np.add.at(load, s, z)
    np.add.at(load, e, -z)
    peak = int(np.argmax(np.cumsum(load)))
    low, high = max(holes_at(peak, s, e, z, o, int((o + z).max())), key=lambda h: h[1] - h[0])
    band = np.flatnonzero((o < high) & (o + z > low) & (z > 0))
    o = replace(bufs, band, np.where(o >= high, o - (high - low), o))
    print(f"2 band removal at tick {peak}: hole {high - low} bytes at {low / lb:.4f}, "
          f"{len(band)} buffers placed again: {(o + z).max() / lb:.5f} x bound, "
          f"{time.perf_counter() - t:.1f} s")

    bad = np.flatnonzero(o + z > target)
    if not len(bad):
        return 0
    print(f"{len(bad)} buffers above the target, ticks [{s[bad].min()}, {e[bad].max()})",
          flush=True)
    t0, t1 = int(s[bad].min()) - args.margin, int(e[bad].max()) + args.margin
    gaps = {g for tick in range(int(s[bad].min()), int(e[bad].max()))
            for g in holes_at(tick, s, e, z, o, lb) if g[1] - g[0] >= z[bad].min()}
    lo = int(args.low * lb) if args.low is not None else min(g[0] for g in gaps)
    tops = [min(target, int(args.high * lb))] if args.high is not None else sorted(
        {g[1] for g in gaps if g[0] >= lo})
    for hi in tops:
        inside = (o >= lo) & (o + z <= hi) & (z > 0) & ((e - s) <= args.max_life)
        free = np.union1d(np.flatnonzero((s < t1) & (e > t0) & inside), bad)
        a, b = int(s[free].min()), int(e[free].max())
        is_free = np.zeros(len(bufs), bool)
        is_free[free] = True
        near = np.flatnonzero(~is_free & (s < b) & (e > a) & (o < hi) & (o + z > lo) & (z > 0))
        pins = [j for j in near if np.any((s[free] < e[j]) & (e[free] > s[j]))]
        local = [Buffer(bufs[k].id, int(s[k]), int(e[k]), int(z[k]), bufs[k].alignment)
                 for k in free]
        for j in pins:
            bottom, top = max(int(o[j]), lo), min(int(o[j] + z[j]), hi)
            local.append(Buffer(bufs[j].id, int(max(s[j], a)), int(min(e[j], b)), top - bottom,
                                1, bottom - lo))
        t = time.perf_counter()
        r = solve_exact(Problem(local), capacity=hi - lo, node_limit=args.nodes, work_limit=None)
        print(f"3 exact in band [{lo / lb:.4f}, {hi / lb:.4f}) x bound: {len(bad)} above target, "
              f"{len(free)} free, {len(pins)} pinned, {r.nodes} nodes, {r.stopped_by.value}, "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        if r.plan is not None:
            break
    if r.plan is None:
        print("no plan in any band")
        return 1
    for n, k in enumerate(free):
        o[k] = r.plan.offsets[n] + lo
    validate(p, Plan(p, tuple(int(x) for x in o)))
    print(f"final (validated): {(o + z).max() / lb:.7f} x bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
