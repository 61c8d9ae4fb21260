"""The exact planner on minimalloc's 11-instance "challenging" suite: a table of times and nodes.

Each instance is posed at the capacity in its file name (2^20). The default is minimalloc's own
question, the decision version: find any plan that fits. ``--optimise`` instead minimises the
height within the time limit (for C, D and J the capacity is above the lower bound). Every plan
found is checked by the independent validator before it is counted.

    .venv/bin/python bench/exact_challenging.py [--data DIR] [--time-limit S] [--only A,C]
        [--off nogoods,section_inference]

``--off`` turns techniques of the solver off (names of ``SolverParams``' switches), to measure
what each one buys.

The data folder is ``--data DIR`` or ``$TENSORARENA_DATA``, as for ``tensorarena bench plan``:
the folder holding ``minimalloc/challenging/`` (or that folder itself). Without it the run is
skipped, saying so.

Times are wall-clock on whatever machine runs this, single-threaded, pure Python + NumPy; the
minimalloc column is the C++ solver's time from the paper (ASPLOS 2023 slides), for scale.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from tensorarena.bench.plan import DATA_ENV, data_folder
from tensorarena.planning.csv_io import capacity_from_name, read_problem
from tensorarena.planning.exact import solve_exact
from tensorarena.planning.exact_params import SolverParams
from tensorarena.planning.validate import validate

#: minimalloc's times on the suite, in milliseconds (paper, "challenging suite" table).
MINIMALLOC_MS = {
    "A": 4910, "B": 3661, "C": 637, "D": 2674, "E": 3717, "F": 5358,
    "G": 1181, "H": 1808, "I": 3908, "J": 883, "K": 628,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", metavar="DIR",
        help=f"benchmark data folder holding minimalloc/challenging/, or that folder itself "
             f"(default: ${DATA_ENV})",
    )
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per instance")
    parser.add_argument("--only", default="", help="comma-separated instance names, e.g. A,C")
    parser.add_argument(
        "--optimise", action="store_true", help="minimise the height instead of fitting"
    )
    parser.add_argument(
        "--off", default="",
        help=f"techniques to turn off, comma-separated: {', '.join(SolverParams.switches())}",
    )
    args = parser.parse_args(argv)
    off = [name.strip() for name in args.off.split(",") if name.strip()]
    unknown = sorted(set(off) - set(SolverParams.switches()))
    if unknown:
        parser.error(f"unknown techniques {unknown}; known: {', '.join(SolverParams.switches())}")
    params = SolverParams(**dict.fromkeys(off, False))

    data = data_folder(args.data)
    if data is None:
        print(f"skipped: no benchmark data (pass --data DIR or set {DATA_ENV})")
        return 0
    folder = data / "minimalloc" / "challenging"
    if not folder.is_dir():
        folder = data  # the challenging folder itself
    files = sorted(folder.glob("*.csv"))
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    if wanted:
        files = [f for f in files if f.name.split(".")[0] in wanted]
    if not files:
        print(f"skipped: no matching *.csv files in {folder} "
              f"(pass --data DIR or set {DATA_ENV})")
        return 0

    mode = "optimise" if args.optimise else "decision"
    print(
        f"exact planner, {mode} version, time limit {args.time_limit:g} s per instance"
        f"{'; off: ' + ', '.join(off) if off else ''}; "
        f"Python {platform.python_version()} on {platform.machine()} "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
    )
    header = (
        f"{'inst':<5}{'buffers':>8}{'lower bnd':>11}{'capacity':>10}{'height':>10}"
        f"{'status':>12}{'nodes':>10}{'seconds':>9}{'minimalloc':>12}"
    )
    print(header)
    print("-" * len(header))
    solved = 0
    total_seconds = 0.0
    for path in files:
        name = path.name.split(".")[0]
        capacity = capacity_from_name(path)
        problem = read_problem(path)  # the capacity is passed explicitly where it applies
        if args.optimise or capacity is None:
            result = solve_exact(problem, time_limit=args.time_limit, params=params)
        else:
            result = solve_exact(problem, capacity=capacity, time_limit=args.time_limit,
                                 params=params)
        height = "-"
        if result.plan is not None:
            validate(problem, result.plan, capacity=None if args.optimise else capacity)
            assert result.plan.height >= result.lower_bound
            height = str(result.plan.height)
        if args.optimise:
            status = "optimal" if result.proven else "best found"
            fits = result.plan is not None and (capacity is None or result.plan.height <= capacity)
        else:
            status = "fits" if result.feasible else ("infeasible" if result.proven else "timeout")
            fits = result.feasible
        solved += fits
        total_seconds += result.seconds
        reference = MINIMALLOC_MS.get(name)
        print(
            f"{name:<5}{len(problem):>8}{result.lower_bound:>11}{capacity or '-':>10}{height:>10}"
            f"{status:>12}{result.nodes:>10}{result.seconds:>9.2f}"
            f"{(f'{reference / 1000:.2f}' if reference else '-'):>12}"
        )
    print("-" * len(header))
    print(f"{solved}/{len(files)} fit their capacity; {total_seconds:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
