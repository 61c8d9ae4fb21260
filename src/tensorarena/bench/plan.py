"""``tensorarena bench plan``: the planners on the public suites and on real models.

Suites (each skipped with a printed message when its data or dependencies are missing):

- ``pisarchyk``: the 8-tensor example of Pisarchyk & Lee (arXiv 2001.03288), optimum 124;
- ``minimalloc``: google/minimalloc's 11 "challenging" instances at the capacity in their file
  names (1048576), planned with ``--planner`` (default ``auto``) inside that capacity;
- ``idealloc``: the five large real traces of cappadokes/idealloc, planned by the portfolio and
  compared with the best greedy height printed in that folder's README;
- ``models``: transformers architectures from :mod:`tensorarena.planning.models` (inference and
  training graphs), planned by ``auto``.

The public data (minimalloc's and idealloc's CSV files) is not part of the package: its folder,
holding ``minimalloc/challenging/`` and ``idealloc/``, is ``--data DIR`` or the environment
variable ``TENSORARENA_DATA``. Without either, the suites that need it are skipped, saying so.

Every plan goes through the independent validator; the table says so in its ``valid`` column.
This prints numbers, it asserts nothing: timings depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tensorarena._version import build

__all__ = ["DATA_ENV", "SUITES", "Row", "configure", "data_folder", "main", "run"]

SUITES = ("pisarchyk", "minimalloc", "idealloc", "models")

#: The environment variable naming the benchmark data folder when ``--data`` is not given.
DATA_ENV = "TENSORARENA_DATA"
_DATA_HINT = (f"pass --data DIR or set {DATA_ENV} to the folder holding minimalloc/challenging/ "
              "and idealloc/")

# Best of the three greedy heights (size/best fit, size/first fit, lifetime/best fit) in
# benchmarks/idealloc/README.md, measured there by a throw-away script: the bar to beat.
IDEALLOC_GREEDY_BEST = {
    "resnet50": 1522216620,
    "pangu_2.6B": 5714911295,
    "G_1": 3039277202,
    "S_1": 1535980319,
    "Y_1": 498978108592,
}
IDEALLOC_FILES = (
    "somas_tensors/resnet50.csv",
    "iopddl/G_1.csv",
    "somas_tensors/pangu_2.6B.csv",
    "iopddl/S_1.csv",
    "iopddl/Y_1.csv",
)
# Pisarchyk & Lee, Fig. 1: (size, first op, last op), both ops inclusive.
PISARCHYK_LEE = ((32, 0, 1), (28, 1, 4), (36, 2, 5), (16, 3, 5), (8, 4, 5), (64, 5, 7),
                 (10, 6, 8), (40, 7, 8))


@dataclass
class Row:
    """One planned instance."""

    instance: str
    buffers: int
    lower_bound: int
    height: int
    ratio: float
    seconds: float
    valid: bool
    planner: str
    fits: bool | None = None  #: against the instance's capacity, when it has one
    validate_seconds: float = 0.0  #: the independent check, not counted in ``seconds``
    reference: int | None = None  #: a published height to compare with
    note: str = ""
    nodes: int = 0  #: exact-search nodes: the same on any machine, unless time ended it
    stopped_by: str = ""  #: what ended the search (a StopReason's value)


@dataclass
class Suite:
    """A suite's rows, or why it was skipped."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    skipped: str = ""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's arguments."""
    parser.add_argument("--data", metavar="DIR",
                        help=f"benchmark data folder, holding minimalloc/challenging/ and "
                             f"idealloc/ (default: ${DATA_ENV}; without either, the suites "
                             "that need data are skipped, saying so)")
    parser.add_argument("--suite", action="append", choices=SUITES, metavar="SUITE",
                        help=f"run only this suite (repeatable): {', '.join(SUITES)}")
    parser.add_argument("--planner", default="auto",
                        help="planner for the minimalloc and models suites (default: auto)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="outer bound per instance (default: the planner's, "
                             "the node budget ends the search first; 1 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="small instances and short limits: a smoke run in seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def data_folder(given: str | os.PathLike[str] | None) -> Path | None:
    """The benchmark data folder: ``given`` (``--data``), else ``$TENSORARENA_DATA``, else None."""
    chosen = given if given else os.environ.get(DATA_ENV)
    return Path(chosen).resolve() if chosen else None


def _missing(what: str, data: Path | None) -> FileNotFoundError:
    if data is None:
        return FileNotFoundError(f"no benchmark data for {what}: {_DATA_HINT}")
    return FileNotFoundError(f"no {what} under {data} ({_DATA_HINT})")


def _measure(name: str, problem: Any, planner: str, *, time_limit: float,
             capacity: int | None = None, reference: int | None = None) -> Row:
    from tensorarena.errors import InvalidPlanError
    from tensorarena.planning.planners import PlanDoesNotFitError
    from tensorarena.planning.planners import plan as make_plan
    from tensorarena.planning.validate import validate

    start = time.perf_counter()
    try:
        plan = make_plan(problem, planner, capacity=capacity, time_limit=time_limit)
        fits: bool | None = None if capacity is None else True
    except PlanDoesNotFitError as exc:
        plan, fits = exc.plan, False
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    try:
        validate(problem, plan)
        valid = True
    except InvalidPlanError:
        valid = False
    checked = time.perf_counter() - start
    bound = problem.lower_bound()
    statistics = plan.statistics
    return Row(name, len(problem), bound, plan.height, plan.height / bound if bound else 1.0,
               seconds, valid, plan.planner, fits, checked, reference,
               "optimal" if plan.optimal else "",
               0 if statistics is None else statistics.nodes,
               "" if statistics is None else statistics.stopped_by.value)


def _pisarchyk(args: argparse.Namespace, data: Path | None) -> Iterator[Row]:
    from tensorarena.planning.problem import Buffer, Problem

    problem = Problem(
        (Buffer(f"t{i}", first, last + 1, size)
         for i, (size, first, last) in enumerate(PISARCHYK_LEE)),
        name="pisarchyk_lee",
    )
    for planner in ("greedy_size", "greedy_size_first_fit", "greedy_breadth", "heap_best_fit",
                    "auto"):
        yield _measure(f"pisarchyk_lee ({planner})", problem, planner,
                       time_limit=args.time_limit, reference=124)


def _minimalloc(args: argparse.Namespace, data: Path | None) -> Iterator[Row]:
    from tensorarena.planning.csv_io import capacity_from_name, read_problem

    folder = None if data is None else data / "minimalloc" / "challenging"
    if folder is None or not folder.is_dir():
        raise _missing("the minimalloc challenging suite", data)
    files = sorted(folder.glob("*.csv"))
    if args.quick:
        files = files[:3]
    for path in files:
        problem = read_problem(path)
        capacity = capacity_from_name(path)
        yield _measure(path.name.split(".")[0], problem, args.planner,
                       time_limit=args.time_limit, capacity=capacity, reference=capacity)


def _idealloc(args: argparse.Namespace, data: Path | None) -> Iterator[Row]:
    from tensorarena.planning.csv_io import read_problem

    folder = None if data is None else data / "idealloc"
    if folder is None or not folder.is_dir():
        raise _missing("the idealloc traces", data)
    files = IDEALLOC_FILES[:2] if args.quick else IDEALLOC_FILES
    for relative in files:
        path = folder / relative
        if not path.is_file():
            print(f"  idealloc: {relative} missing, skipped", file=sys.stderr)
            continue
        problem = read_problem(path)
        yield _measure(path.stem, problem, "portfolio", time_limit=args.time_limit,
                       reference=IDEALLOC_GREEDY_BEST.get(path.stem))


def _models(args: argparse.Namespace, data: Path | None) -> Iterator[Row]:
    size: Literal["tiny", "base"] = "tiny" if args.quick else "base"
    try:
        # import_module, not "from ... import": it honours a module masked in sys.modules.
        models = importlib.import_module("tensorarena.planning.models")
        # model_problems checks its dependencies (torch, transformers) when called.
        suites = [models.model_problems(size=size, training=t) for t in (False, True)]
    except ImportError as exc:
        raise FileNotFoundError(f"real-model problems unavailable ({exc})") from exc
    for training, problems in zip((False, True), suites, strict=True):
        for name, graph in problems:
            problem = graph.problem
            label = f"{name} ({'training' if training else 'inference'})"
            yield _measure(label, problem, args.planner, time_limit=args.time_limit,
                           reference=sum(b.nbytes for b in problem.buffers))


_RUNNERS: dict[str, tuple[str, Callable[[argparse.Namespace, Path | None], Iterator[Row]]]] = {
    "pisarchyk": ("Pisarchyk & Lee 8-tensor example (optimum 124)", _pisarchyk),
    "minimalloc": ("minimalloc challenging suite at capacity 1048576 (reference = capacity)",
                   _minimalloc),
    "idealloc": ("idealloc traces, portfolio (reference = best README greedy)", _idealloc),
    "models": ("transformers models (reference = no reuse: sum of sizes)", _models),
}


def _print_suite(suite: Suite) -> None:
    print(f"\n{suite.title}")
    if suite.skipped:
        print(f"  skipped: {suite.skipped}")
        return
    header = ("instance", "buffers", "lower bound", "height", "height/LB", "vs ref", "fits",
              "time s", "check s", "valid", "planner")
    table = [header]
    for r in suite.rows:
        vs_ref = f"{r.height / r.reference:.4f}" if r.reference else "-"
        fits = "-" if r.fits is None else ("yes" if r.fits else "NO")
        table.append((r.instance, str(r.buffers), str(r.lower_bound), str(r.height),
                      f"{r.ratio:.4f}", vs_ref, fits, f"{r.seconds:.2f}",
                      f"{r.validate_seconds:.2f}", "yes" if r.valid else "NO",
                      r.planner + (f" [{r.note}]" if r.note else "")))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = (cell.rjust(w) if 0 < i < 10 else cell.ljust(w)
                 for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
        print(("  " + "  ".join(cells)).rstrip())


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # not on every platform
        return None


def run(args: argparse.Namespace) -> int:
    """Run the selected suites and print their tables (or one JSON object); return 0."""
    if args.time_limit is None:
        from tensorarena.planning.planners import DEFAULT_TIME_LIMIT

        args.time_limit = 1.0 if args.quick else DEFAULT_TIME_LIMIT
    data = data_folder(args.data)
    suites: list[Suite] = []
    if not args.json:
        print(f"bench plan: {build()} build, {os.cpu_count()} CPUs, load average {_load()}, "
              f"time limit {args.time_limit:g} s, data {data or 'none (' + _DATA_HINT + ')'}")
    for name in args.suite or SUITES:
        title, runner = _RUNNERS[name]
        suite = Suite(name, title)
        try:
            for row in runner(args, data):
                suite.rows.append(row)
                if not args.json and sys.stderr.isatty():
                    print(f"  {name}: {row.instance}: height {row.height} in {row.seconds:.2f} s",
                          file=sys.stderr)
        except FileNotFoundError as exc:
            suite.skipped = str(exc)
        except Exception as exc:  # a broken optional suite must not hide the others
            suite.skipped = f"failed: {type(exc).__name__}: {exc}"
        suites.append(suite)
        if not args.json:
            _print_suite(suite)
    if args.json:
        print(json.dumps({
            "build": build(),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count(), "load_average": _load()},
            "time_limit": args.time_limit,
            "suites": {s.name: ({"skipped": s.skipped} if s.skipped else
                                {"rows": [asdict(r) for r in s.rows]}) for s in suites},
        }))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m tensorarena.bench.plan``."""
    parser = argparse.ArgumentParser(prog="tensorarena bench plan", description=__doc__)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
