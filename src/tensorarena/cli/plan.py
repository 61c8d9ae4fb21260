"""``tensorarena plan PROBLEM.csv``: plan offsets for a minimalloc CSV and report the result.

A contract other tools rely on. With ``--json`` stdout holds exactly one JSON object::

    {"buffers": n, "lower_bound": int, "bound": int, "height": int, "ratio": float,
     "optimal": bool, "feasible": bool, "planner": str, "seconds": float,
     "validate_seconds": float}

``feasible`` means the plan fits ``--capacity`` (always true without one); ``optimal`` means
proven, which includes a height equal to the lower bound. ``lower_bound`` is the peak of live
bytes and ``ratio`` is the height over it; ``bound`` is the best lower bound the planner knows
(alignment padding counted, raised by every capacity the exact search proved infeasible).
``seconds`` is the planning alone; ``validate_seconds`` the independent check that follows.
Exit status: 0 for a valid plan that fits; 1 when none was found that fits within the time limit
(the best height is still printed); 2 for bad input (malformed CSV, with line and column on
stderr; unreadable file; bad option), always as a one-line message, never a traceback.

With ``--capacity`` the planner answers "does it fit?" and stops at the first plan that fits;
``--minimize`` lowers it further. Without, it stops at a plan within ``--gap`` of the bound. On a
terminal, the best height so far is shown on stderr while it runs (``--quiet``: never).

Sizes follow the one rule of :mod:`tensorarena.sizes` (``1MB`` is 10**6 bytes, ``1MiB`` and
``1M`` are 2**20), stated in ``--help``. A capacity in decimal units that misses while its binary
reading would not (the lower bound fits in it, or the file name states it) gets a "did you mean
1MiB?" note on stderr.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensorarena.errors import InvalidPlanError, TensorArenaError
from tensorarena.sizes import SIZE_RULE, check_alignment, format_size, parse_size

if TYPE_CHECKING:
    from tensorarena.planning.problem import PlanStatistics
    from tensorarena.planning.progress import Progress

__all__ = ["configure", "run"]

# A size in decimal units ("1MB", "1.5 GB"): the number and the unit's letter.
_DECIMAL = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt])b\s*$", re.IGNORECASE)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``plan`` command's arguments."""
    from tensorarena.planning.planners import DEFAULT_GAP, DEFAULT_TIME_LIMIT, PLANNERS

    parser.epilog = (
        f"Sizes (--capacity, --alignment): {SIZE_RULE}; so 1MB is 1000000 bytes and 1MiB (or 1M) "
        "is 1048576. Exit status: 0 a valid plan that fits; 1 none found that fits within the "
        "time limit (the best height is still reported); 2 bad input or option."
    )

    parser.add_argument("problem", metavar="PROBLEM.csv", help="minimalloc CSV problem file")
    parser.add_argument(
        "--planner", default="auto", choices=list(PLANNERS),
        help="planner to run (default: auto = portfolio, then exact search if above the bound)",
    )
    parser.add_argument("--capacity", metavar="N",
                        help="arena size the plan must fit, e.g. 1048576 or 1MiB (not 1MB: "
                             "that is 1000000)")
    parser.add_argument("--alignment", metavar="N",
                        help="minimum alignment of every offset (a power of two, e.g. 64)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                        help=f"limit for the exact search (default {DEFAULT_TIME_LIMIT:g}; "
                             "inf: none)")
    parser.add_argument("--gap", type=float, default=DEFAULT_GAP, metavar="FRACTION",
                        help="stop at a plan within this relative gap of the lower bound "
                             f"(default {DEFAULT_GAP:g}; 0: prove optimality)")
    parser.add_argument("--minimize", action="store_true",
                        help="with --capacity: keep lowering the plan after it fits (default: "
                             "stop at the first plan that fits)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress on stderr (shown only on a terminal anyway)")
    parser.add_argument("--out", metavar="SOLUTION.csv",
                        help="write the plan as a minimalloc solution CSV (only when it fits)")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON object on stdout")


def _fail(message: str) -> int:
    print(f"tensorarena plan: error: {message}", file=sys.stderr)
    return 2


class _ProgressLine:
    """Best height so far against the bound, rewritten in place on a terminal's stderr.

    With rich installed (the ``plot`` or ``dev`` extra) it is a rich status line with a spinner;
    otherwise one plain line rewritten with a carriage return. Nothing at all when stderr is not
    a terminal or with ``--quiet``: a pipe or a log file gets only the final result.
    """

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._status: Any = None
        self._plain = False

    def __enter__(self) -> _ProgressLine:
        if not self.enabled:
            return self
        try:
            from rich.console import Console
        except ImportError:  # rich is optional: plain text
            self._plain = True
            self._show(f"planning {self.label}")
            return self
        self._status = Console(stderr=True).status(f"planning {self.label}")
        self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
        elif self._plain:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        best = "none yet" if progress.height is None else f"{progress.height}"
        gap = "" if progress.height is None else f" (+{100 * progress.gap:.3f} %)"
        nodes = f", {progress.nodes} nodes" if progress.nodes else ""
        self._show(f"planning {self.label}: best {best} vs bound {progress.bound}{gap}, "
                   f"{progress.seconds:.1f} s{nodes}")

    def _show(self, text: str) -> None:
        if self._status is not None:
            self._status.update(text)
        else:
            sys.stderr.write(f"\r\x1b[K{text}")
            sys.stderr.flush()


def _unit_slip(text: str | None, capacity: int, bound: int, named: int | None) -> str:
    """A note when a decimal capacity ("1MB") that misses looks meant as binary ("1MiB")."""
    match = None if text is None else _DECIMAL.match(text)
    if text is None or match is None:
        return ""
    binary_text = f"{match.group(1)}{match.group(2).upper()}iB"
    try:
        binary = parse_size(binary_text)
    except TensorArenaError:  # "0.001MB" is whole in bytes, "0.001MiB" is not
        return ""
    if named == binary:
        why = f"the file name says {binary}"
    elif bound <= binary:
        why = f"the lower bound, {bound} bytes, fits in {binary_text}"
    else:
        return ""
    return (
        f"--capacity {text.strip()} is {capacity} bytes (kB/MB/GB/TB are powers of 1000); "
        f"did you mean {binary_text} ({binary} bytes)? {why}"
    )


def run(args: argparse.Namespace) -> int:
    """Run the command; return the exit status (0 fits, 1 no fit found, 2 bad input)."""
    from tensorarena.planning._options import check_gap, check_time_limit
    from tensorarena.planning.csv_io import capacity_from_name, read_problem, write_solution
    from tensorarena.planning.planners import PlanDoesNotFitError, plan
    from tensorarena.planning.validate import validate

    try:
        capacity = (None if args.capacity is None
                    else parse_size(args.capacity, name="--capacity", allow_zero=True))
        alignment = None
        if args.alignment is not None:
            alignment = check_alignment(parse_size(args.alignment, name="--alignment"),
                                        name="--alignment")
        check_time_limit(args.time_limit, name="--time-limit")
        check_gap(args.gap, name="--gap")
    except TensorArenaError as exc:
        return _fail(str(exc))
    try:
        # The capacity goes to plan() rather than into the problem, so that the validator below
        # checks the geometry alone and a plan that misses the capacity can still be reported.
        # A Path, so that a file name is never read as CSV text.
        problem = read_problem(Path(args.problem))
    except TensorArenaError as exc:
        message = str(exc)
        return _fail(message if args.problem in message else f"{args.problem}: {message}")

    start = time.perf_counter()
    fits = True
    label = f"{len(problem)} buffers with {args.planner}"
    try:
        with _ProgressLine(label, not args.quiet) as progress:
            result = plan(problem, args.planner, capacity=capacity, time_limit=args.time_limit,
                          alignment=alignment, gap=args.gap, minimize=args.minimize,
                          progress=progress)
    except PlanDoesNotFitError as exc:
        result, fits = exc.plan, False
    except TensorArenaError as exc:
        return _fail(str(exc))
    seconds = time.perf_counter() - start
    checked = problem if alignment is None else problem.with_alignment(alignment)
    start = time.perf_counter()
    try:
        validate(checked, result)
    except InvalidPlanError as exc:  # a planner bug: never report an invalid plan as a result
        print(f"tensorarena plan: internal error: invalid plan: {exc}", file=sys.stderr)
        return 1
    validate_seconds = time.perf_counter() - start

    bound = problem.lower_bound()
    height = result.height
    ratio = height / bound if bound else (1.0 if height == 0 else float("inf"))
    summary = {
        "buffers": len(problem),
        "lower_bound": bound,
        "height": height,
        "ratio": ratio,
        "optimal": bool(result.optimal or height == bound),
        "feasible": fits,
        "planner": result.planner,
        "seconds": seconds,
        "validate_seconds": validate_seconds,
        "bound": bound if result.statistics is None else max(bound, result.statistics.bound),
    }
    if args.out is not None and fits:
        try:
            write_solution(result, args.out)
        except OSError as exc:
            return _fail(f"cannot write {args.out}: {exc.strerror or exc}")
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(args, summary, capacity, result.statistics)
    if not fits and capacity is not None:
        slip = _unit_slip(args.capacity, capacity, bound, capacity_from_name(args.problem))
        if slip:
            print(f"tensorarena plan: note: {slip}", file=sys.stderr)
    return 0 if fits else 1


def _print_summary(args: argparse.Namespace, summary: dict[str, Any], capacity: int | None,
                   statistics: PlanStatistics | None) -> None:
    height = summary["height"]
    lines = [
        f"problem      {args.problem} ({summary['buffers']} buffers)",
        f"planner      {summary['planner']}",
        f"lower bound  {summary['lower_bound']} ({format_size(summary['lower_bound'])})",
        f"height       {height} ({format_size(height)}), {summary['ratio']:.4f} x lower bound"
        + (", optimal" if summary["optimal"] else ""),
    ]
    if capacity is not None:
        verdict = "fits" if summary["feasible"] else "DOES NOT FIT (best plan found shown)"
        lines.append(f"capacity     {capacity} ({format_size(capacity)}): {verdict}")
    lines.append(f"time         {summary['seconds']:.3f} s planning, "
                 f"{summary['validate_seconds']:.3f} s validating")
    if statistics is not None and statistics.exact_skipped:
        lines.append("note         exact search skipped: too many overlapping pairs for the time "
                     "limit (raise --time-limit)")
    elif statistics is not None and statistics.nodes:
        lines.append(f"search       {statistics.nodes} nodes")
    if args.out is not None:
        written = args.out if summary["feasible"] else "not written (the plan does not fit)"
        lines.append(f"solution     {written}")
    print("\n".join(lines))
