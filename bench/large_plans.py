"""Large real traces against their lower bound: the portfolio, the long-lived-first orders, auto.

Issue 9, section 2: on the idealloc traces greedy by size ends 3.3 % (pangu_2.6B) and 2.5 % (S_1)
above the bound and the exact search gains nothing; the target is +1 % within 30 s. For every
trace this prints each stage's height as a ratio to the lower bound (the peak of live bytes), its
seconds, and the stage that won; every plan is checked by the independent validator (its seconds
are printed apart).

``--compare`` runs ``auto`` twice side by side, with the long-lived-first stage and without it
(the stage patched out: ``auto`` as it was before it), which is the check that the minimalloc
challenging suite does not slow down: ``--suite challenging`` poses each instance at the
capacity in its file name (2^20), minimalloc's decision question.

    .venv/bin/python bench/large_plans.py [--data DIR] [--time-limit 30] [--only pangu_2.6B,S_1]
        [--suite idealloc|challenging] [--compare] [--repeat N]

The data folder is ``--data DIR`` or ``$TENSORARENA_DATA`` (the folder holding ``idealloc/`` and
``minimalloc/challenging/``), as for ``tensorarena bench plan``. Times are wall-clock, single
threaded; on a shared machine compare columns of one run, not runs.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from tensorarena.bench.plan import DATA_ENV, IDEALLOC_FILES, data_folder
from tensorarena.planning import heuristics, planners, staged_search
from tensorarena.planning.csv_io import capacity_from_name, read_problem
from tensorarena.planning.long_lived_first import long_lived_first
from tensorarena.planning.problem import Plan, Problem
from tensorarena.planning.validate import validate


def _timed(run: Callable[[], Plan], problem: Problem, capacity: int | None = None
           ) -> tuple[Plan, float, float]:
    start = time.perf_counter()
    try:
        result = run()
    except planners.PlanDoesNotFitError as exc:
        result = exc.plan
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    validate(problem, result)
    return result, seconds, time.perf_counter() - start


def _auto(problem: Problem, time_limit: float, capacity: int | None, *, stage: bool) -> Plan:
    real = staged_search.long_lived_first_planner
    if not stage:
        staged_search.long_lived_first_planner = lambda p, o, **kw: kw["initial"]
    try:
        return planners.plan(problem, "auto", time_limit=time_limit, capacity=capacity)
    finally:
        staged_search.long_lived_first_planner = real


def _files(args: argparse.Namespace, data: Path) -> list[Path]:
    if args.suite == "challenging":
        folder = data / "minimalloc" / "challenging"
        files = sorted(folder.glob("*.csv"))
    else:
        files = [data / "idealloc" / relative for relative in IDEALLOC_FILES]
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    return [f for f in files if f.is_file() and (not only or _name(f) in only)]


def _name(path: Path) -> str:
    """``pangu_2.6B`` for ``pangu_2.6B.csv``, ``A`` for ``A.1048576.csv``."""
    stem = path.stem
    head, _, tail = stem.rpartition(".")
    return head if tail.isdigit() else stem


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", metavar="DIR",
                        help=f"benchmark data folder (default: ${DATA_ENV})")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds for auto")
    parser.add_argument("--only", default="", help="comma-separated names, e.g. pangu_2.6B,S_1")
    parser.add_argument("--suite", choices=("idealloc", "challenging"), default="idealloc")
    parser.add_argument("--compare", action="store_true",
                        help="auto with and without the long-lived-first stage, side by side")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each --compare pair")
    args = parser.parse_args(argv)
    data = data_folder(args.data)
    if data is None:
        print(f"skipped: no benchmark data (pass --data DIR or set {DATA_ENV})")
        return 0
    print(f"# {platform.node()} {platform.python_version()} time limit {args.time_limit:g} s")
    totals = [0.0, 0.0]
    for path in _files(args, data):
        problem = read_problem(path)
        bound = problem.lower_bound()
        name = _name(path)
        capacity = capacity_from_name(path) if args.suite == "challenging" else None
        if args.compare:
            for _ in range(args.repeat):
                cells = []
                for k, stage in enumerate((False, True)):
                    result, seconds, _ = _timed(
                        partial(_auto, problem, args.time_limit, capacity, stage=stage), problem)
                    totals[k] += seconds
                    fits = "" if capacity is None else (
                        " fits" if result.height <= capacity else " DOES NOT FIT")
                    nodes = result.statistics.nodes if result.statistics else 0
                    cells.append(f"{result.height / bound:.4f} x LB {seconds:6.2f} s "
                                 f"{nodes:8d} nodes{fits}")
                print(f"{name:12s} n={len(problem):6d}  auto before: {cells[0]}  "
                      f"after: {cells[1]}", flush=True)
            continue
        portfolio, p_seconds, _ = _timed(partial(heuristics.portfolio, problem), problem)
        orders, o_seconds, _ = _timed(partial(long_lived_first, problem), problem)
        auto, a_seconds, v_seconds = _timed(
            partial(planners.plan, problem, "auto", time_limit=args.time_limit), problem)
        print(f"{name:12s} n={len(problem):6d} LB={bound:14d}  "
              f"portfolio {portfolio.height / bound:.4f} ({p_seconds:5.1f} s)  "
              f"long_lived_first {orders.height / bound:.4f} ({o_seconds:5.1f} s, "
              f"{orders.planner.split(':')[-1]})  auto {auto.height / bound:.4f} "
              f"({a_seconds:5.1f} s, {auto.planner}; validate {v_seconds:.1f} s)", flush=True)
    if args.compare:
        print(f"total auto seconds: before {totals[0]:.2f}, after {totals[1]:.2f} "
              f"(after/before {totals[1] / max(totals[0], 1e-9):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
