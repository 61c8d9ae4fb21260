"""S_1 (and the other idealloc traces) against the bound, before and after the peak stack.

Issue 26: the target is S_1 at ≤ 1.002 x its lower bound at ``--time-limit 30``. One ``auto`` run
per trace at the time limit (what ``tensorarena plan FILE --time-limit 30`` returns), then
:func:`~tensorarena.planning.peak_stack.peak_stack` on that plan on its default work budget,
and for comparison the windowed repair (:func:`~tensorarena.planning.repair.repair`) on it.
Every plan is checked by the independent validator. Printed per trace: bound, heights and ratios,
seconds, the peak stack's work units, orders placed, winning order and what ended it. The last
columns start from nothing: the portfolio, then the peak stack on its plan (what a stage of
``auto`` between the two would cost), with their seconds together.

    .venv/bin/python bench/s1_probe.py [--data DIR] [--time-limit 30] [--all] [--no-repair]
    .venv/bin/python bench/s1_probe.py --challenging
    .venv/bin/python bench/s1_probe.py --variants

``--variants`` places, on S_1, the crossers (the buffers live at the peak) stacked first in
several orders (by birth, by death, in the long-lived-first order) and the rest by size or long
lived first, and prints each height: the crossers' own order is what matters.
``--all`` adds resnet50, G_1, pangu_2.6B and Y_1. ``--challenging`` instead compares, on
minimalloc's challenging suite, the portfolio's height with the peak stack's on that plan.

The data folder is ``--data DIR`` or ``$TENSORARENA_DATA`` (the folder holding ``idealloc/``); a
missing trace is skipped, saying so.
Times are wall-clock on whatever else the machine runs: compare columns of one run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

from tensorarena.bench.plan import DATA_ENV, data_folder
from tensorarena.planning.csv_io import read_problem
from tensorarena.planning.heuristics import PlacementArrays, place, portfolio, size_order
from tensorarena.planning.long_lived_first import long_lived_order
from tensorarena.planning.peak_stack import peak_crossers, peak_stack
from tensorarena.planning.planners import plan
from tensorarena.planning.repair import repair
from tensorarena.planning.validate import validate

S_1 = "iopddl/S_1.csv"
OTHERS = ("somas_tensors/resnet50.csv", "iopddl/G_1.csv", "somas_tensors/pangu_2.6B.csv",
          "iopddl/Y_1.csv")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help=f"benchmark folder (default ${DATA_ENV})")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--all", action="store_true", help="the other idealloc traces too")
    parser.add_argument("--no-repair", action="store_true", help="skip the windowed repair")
    parser.add_argument("--variants", action="store_true",
                        help="S_1: heights of the crossers-first orders, one per variant")
    parser.add_argument("--challenging", action="store_true",
                        help="minimalloc's challenging suite: portfolio vs peak stack heights")
    args = parser.parse_args(argv)
    data = data_folder(args.data)
    if data is None:
        print(f"no data folder: pass --data or set ${DATA_ENV}; nothing measured")
        return 0
    if args.challenging:
        return challenging(data)
    if args.variants:
        return variants(data)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"time limit {args.time_limit:g} s")
    print("| trace | buffers | bound | auto | auto s | peak stack | s | work | orders | won by "
          "| stopped by | windowed repair | s | portfolio, then peak stack | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for relative in (S_1, *OTHERS) if args.all else (S_1,):
        path = data / "idealloc" / relative
        if not path.is_file():
            print(f"{relative}: missing from {data}, skipped", file=sys.stderr)
            continue
        problem = read_problem(path)
        bound = problem.lower_bound()
        start = time.perf_counter()
        result = plan(problem, "auto", time_limit=args.time_limit)
        auto_s = time.perf_counter() - start
        validate(problem, result)
        start = time.perf_counter()
        stacked = peak_stack(problem, result)
        stack_s = time.perf_counter() - start
        validate(problem, stacked.plan)
        repaired, repair_s = "-", "-"
        if not args.no_repair:
            start = time.perf_counter()
            lowered = repair(problem, result, time_limit=args.time_limit).plan
            repair_s = f"{time.perf_counter() - start:.1f}"
            validate(problem, lowered)
            repaired = f"{lowered.height / bound:.5f}"
        start = time.perf_counter()
        scratch = peak_stack(problem, portfolio(problem)).plan
        scratch_s = time.perf_counter() - start
        validate(problem, scratch)
        print(f"| {path.stem} | {len(problem)} | {bound} | {result.height / bound:.5f} | "
              f"{auto_s:.1f} | {stacked.plan.height / bound:.5f} | {stack_s:.1f} | "
              f"{stacked.work:,} | {stacked.placements} | {stacked.order or '-'} | "
              f"{stacked.stopped_by.value} | {repaired} | {repair_s} | "
              f"{scratch.height / bound:.5f} | {scratch_s:.1f} |", flush=True)
    return 0


def variants(data: Path) -> int:
    """S_1's height when its crossers are stacked first in each order, the rest after."""
    path = data / "idealloc" / S_1
    if not path.is_file():
        print(f"{S_1}: missing from {data}, nothing measured")
        return 0
    problem = read_problem(path)
    bound = problem.lower_bound()
    arrays = PlacementArrays(problem, None)
    crossers = peak_crossers(arrays)
    is_crosser = np.zeros(arrays.n, np.bool_)
    is_crosser[crossers] = True
    start, end, size = arrays.start[crossers], arrays.end[crossers], arrays.size[crossers]
    long_lived = long_lived_order(arrays, 0.3)
    stacks = {
        "birth": crossers[np.lexsort((crossers, -size, -end, start))],
        "death": crossers[np.lexsort((crossers, -size, start, -end))],
        "long-lived-first 0.3": long_lived[is_crosser[long_lived]],
        "none (no crossers first)": crossers[:0],
    }
    rests = {"size": size_order(arrays), "long-lived-first 0.3": long_lived}
    print(f"S_1: {len(crossers)} of {arrays.n} buffers live at the peak; bound {bound}")
    print("| crossers stacked by | rest by | height / bound |")
    print("|---|---|---|")
    for stack_name, stack in stacks.items():
        for rest_name, rest in rests.items():
            order = np.concatenate((stack, rest[~is_crosser[rest]] if len(stack) else rest))
            offsets = place(arrays, order.astype(np.int64), best_fit=True)
            height = int((offsets + arrays.size).max())
            print(f"| {stack_name} | {rest_name} | {height / bound:.5f} |", flush=True)
    return 0


def challenging(data: Path) -> int:
    """Portfolio height and the peak stack's on it, per instance of the challenging suite."""
    folder = data / "minimalloc" / "challenging"
    paths = sorted(folder.glob("*.csv"))
    if not paths:
        print(f"no instances in {folder}; nothing measured")
        return 0
    print("| instance | buffers | bound | portfolio | peak stack | won by | s |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        problem = read_problem(path)
        start_plan = portfolio(problem)
        start = time.perf_counter()
        result = peak_stack(problem, start_plan)
        seconds = time.perf_counter() - start
        validate(problem, result.plan)
        print(f"| {path.name.split('.')[0]} | {len(problem)} | {problem.lower_bound()} | "
              f"{start_plan.height} | {result.plan.height} | {result.order or '-'} | "
              f"{seconds:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
