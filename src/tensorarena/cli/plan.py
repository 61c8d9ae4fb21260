"""``tensorarena plan PROBLEM``: plan offsets for a minimalloc CSV (or a model) and report it.

A contract other tools rely on. With ``--json`` stdout holds exactly one JSON object::

    {"buffers": n, "lower_bound": int, "bound": int, "height": int, "ratio": float,
     "optimal": bool, "feasible": bool, "impossible": bool, "planner": str, "seconds": float,
     "validate_seconds": float, "stopped_by": str, "nodes": int, "node_limit": int | null,
     "work": int, "work_limit": int | null, "time_limit": float | null}

plus ``"offsets": {id: offset}`` with ``--offsets`` and ``"sizes": {id: bytes}`` with ``--sizes``
(each buffer's size as planned, alignment padding not included: with both, every buffer's place
is ``[offset, offset + size)``). ``feasible`` means the plan fits
``--capacity`` (always true without one); ``impossible`` that no plan can fit it (proven: the
bound is above it, or the exact search exhausted every plan); ``optimal`` means proven, which
includes a height equal to the bound. ``lower_bound`` is the peak of live bytes and ``ratio`` is
the height over it; ``bound`` is the best lower bound the planner knows (alignment padding
counted, raised by every capacity the exact search proved infeasible). ``seconds`` is the
planning alone; ``validate_seconds`` the independent check that follows. ``stopped_by`` says
what ended the exact search (``proven``, ``good_enough``, ``budget``, ``time_limit``, or
``not_run``), ``nodes`` what it used of its ``node_limit`` (``--node-limit``: a budget that
gives the same answer on any machine), ``work`` of its ``work_limit`` (``--work-limit``: work
units, nodes weighed by the problem's size, the budget that ends the search on large problems)
and ``seconds`` of its ``time_limit`` (the outer bound; null: none). Exit status: 0 for a
valid plan that fits; 1 when none was found that fits within the time limit (the best height is
still printed); 2 for bad input (malformed CSV, with line and column on stderr; unreadable file;
bad option), always as a one-line message, never a traceback.

PROBLEM is a minimalloc CSV, ``-`` for CSV on stdin, an ONNX model (``.onnx``, with
``--input-shape NAME=D,D`` for dynamic inputs) or a saved ``torch.export`` program (``.pt2``).
minimalloc's own command line works too: ``--input=F --output=F --capacity=N --timeout=10s``,
its solver switches (``--section_inference=false``, ``--nocheck_dominance``, ...),
``--preordering_heuristics=WAT,TAW`` and ``--validate`` (we always validate).

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

from tensorarena.errors import InvalidArgumentError, InvalidPlanError, TensorArenaError
from tensorarena.sizes import SIZE_RULE, check_alignment, format_size, parse_size

if TYPE_CHECKING:
    from tensorarena.planning.problem import PlanStatistics
    from tensorarena.planning.progress import Progress

__all__ = ["configure", "run"]

# A size in decimal units ("1MB", "1.5 GB"): the number and the unit's letter.
_DECIMAL = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt])b\s*$", re.IGNORECASE)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``plan`` command's arguments (ours, and minimalloc's beside them)."""
    from tensorarena.planning.budget import DEFAULT_WORK_LIMIT
    from tensorarena.planning.exact_params import SolverParams
    from tensorarena.planning.exact_sections import PREORDERS
    from tensorarena.planning.planners import (
        DEFAULT_GAP,
        DEFAULT_NODE_LIMIT,
        DEFAULT_TIME_LIMIT,
        PLANNERS,
    )

    parser.epilog = (
        f"Sizes (--capacity, --alignment): {SIZE_RULE}; so 1MB is 1000000 bytes and 1MiB (or 1M) "
        "is 1048576. Exit status: 0 a valid plan that fits; 1 none found that fits within the "
        "time limit (the best height is still reported); 2 bad input or option."
    )

    parser.add_argument("problem", metavar="PROBLEM", nargs="?",
                        help="minimalloc CSV problem file (- for stdin), an ONNX model (.onnx) "
                             "or a saved torch.export program (.pt2)")
    parser.add_argument("--input", metavar="FILE", help="the problem, as minimalloc names it")
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
                        help=f"outer bound on planning time (default {DEFAULT_TIME_LIMIT:g}; "
                             "inf: none); the node budget normally ends the search first")
    parser.add_argument("--node-limit", default=str(DEFAULT_NODE_LIMIT), metavar="NODES",
                        help=f"exact-search budget in nodes, the same answer on any machine "
                             f"(default {DEFAULT_NODE_LIMIT}; none: no budget)")
    parser.add_argument("--work-limit", default=str(DEFAULT_WORK_LIMIT), metavar="UNITS",
                        help=f"exact-search budget in work units (a node costs the problem's "
                             f"buffers plus their time sections), the same answer on any "
                             f"machine (default {DEFAULT_WORK_LIMIT}; none: no budget)")
    parser.add_argument("--timeout", metavar="DURATION",
                        help="minimalloc's time limit: 10s, 500ms, 2m, inf (overrides "
                             "--time-limit)")
    parser.add_argument("--gap", type=float, default=DEFAULT_GAP, metavar="FRACTION",
                        help="stop at a plan within this relative gap of the lower bound "
                             f"(default {DEFAULT_GAP:g}; 0: prove optimality)")
    parser.add_argument("--minimize", action="store_true",
                        help="with --capacity: keep lowering the plan after it fits (default: "
                             "stop at the first plan that fits)")
    parser.add_argument("--repair", action="store_true",
                        help="then lower the plan by exact searches in a band of bytes cut "
                             "at its peak and over the time windows around it, on their own "
                             "budgets (off by default: it costs search time and rarely gains)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME=D,D,...",
                        help="pin a graph input's shape (repeatable), e.g. ids=8,128")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress on stderr (shown only on a terminal anyway)")
    parser.add_argument("--out", "--output", dest="out", metavar="SOLUTION.csv",
                        help="write the plan as a minimalloc solution CSV (only when it fits; "
                             "- for stdout, without --json)")
    parser.add_argument("--json", action="store_true",
                        help="print exactly one JSON object on stdout")
    parser.add_argument("--offsets", action="store_true",
                        help="with --json: include every buffer's offset ({id: offset})")
    parser.add_argument("--sizes", action="store_true",
                        help="with --json: include every buffer's size ({id: bytes}); with "
                             "--offsets, each buffer's place is [offset, offset + size)")
    parser.add_argument("--validate", action="store_true",
                        help="minimalloc's flag; accepted: every plan is validated anyway")
    solver = parser.add_argument_group(
        "exact solver techniques (minimalloc's flags: --NAME=false or --noNAME turns one off)")
    for name in SolverParams.switches():
        solver.add_argument(f"--{name}", type=_boolean, nargs="?", const=True, default=None,
                            metavar="BOOL")
        solver.add_argument(f"--no{name}", dest=name, action="store_const", const=False,
                            help=argparse.SUPPRESS)
    solver.add_argument("--preordering_heuristics", metavar="H,H,...",
                        help=f"static preorders, letters of WATZL (default {','.join(PREORDERS)})")


def _boolean(text: str) -> bool:
    """absl's spellings of a boolean flag's value."""
    lowered = text.strip().lower()
    if lowered in ("true", "t", "1", "yes", "y"):
        return True
    if lowered in ("false", "f", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r} (write --flag=false)")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(h|m|s|ms|us|ns)?\s*$")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, None: 1.0}


def _duration(text: str) -> float:
    """minimalloc's ``--timeout`` (an absl duration: ``10s``, ``500ms``, ``2m``, ``inf``)."""
    if text.strip().lower() in ("inf", "infinite"):
        return float("inf")
    match = _DURATION.match(text)
    if match is None:
        raise InvalidArgumentError(
            f"--timeout must be a duration such as 10s, 500ms, 2m or inf, got {text!r}"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _solver_params(args: argparse.Namespace) -> Any:
    """The :class:`SolverParams` the switches ask for, or None when none was given."""
    from tensorarena.planning.exact_params import SolverParams

    given = {name: getattr(args, name) for name in SolverParams.switches()
             if getattr(args, name) is not None}
    if args.preordering_heuristics is not None:
        given["preorders"] = tuple(h.strip() for h in args.preordering_heuristics.split(",")
                                   if h.strip())
    return SolverParams(**given) if given else None


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
    from tensorarena.planning.csv_io import capacity_from_name, write_solution
    from tensorarena.planning.graph_problem import GraphProblem
    from tensorarena.planning.options import check_gap, check_time_limit
    from tensorarena.planning.planners import PlanDoesNotFitError, plan
    from tensorarena.planning.sources import load_problem, parse_input_shape
    from tensorarena.planning.validate import validate

    source = args.input if args.input is not None else args.problem
    try:
        if args.input is not None and args.problem is not None and args.input != args.problem:
            raise InvalidArgumentError(
                f"two problems given: {args.problem} and --input={args.input}"
            )
        if source is None:
            raise InvalidArgumentError(
                "no problem given: tensorarena plan PROBLEM (or --input=FILE)"
            )
        capacity = (None if args.capacity is None
                    else parse_size(args.capacity, name="--capacity", allow_zero=True))
        if args.minimize and capacity is None:
            raise InvalidArgumentError(
                "--minimize lowers a plan after it fits --capacity: give --capacity, or leave "
                "--minimize out (without a capacity the plan is lowered to within --gap of the "
                "bound anyway)"
            )
        alignment = None
        if args.alignment is not None:
            alignment = check_alignment(parse_size(args.alignment, name="--alignment"),
                                        name="--alignment")
        time_limit = check_time_limit(args.time_limit, name="--time-limit")
        if args.timeout is not None:
            time_limit = _duration(args.timeout)
        check_gap(args.gap, name="--gap")
        node_limit = _node_limit(args.node_limit)
        work_limit = _node_limit(args.work_limit, flag="--work-limit", unit="work units")
        params = _solver_params(args)
        shapes = dict(parse_input_shape(text) for text in args.input_shape)
        if args.out == "-" and args.json:
            raise InvalidArgumentError("--output - and --json both want stdout: choose one")
        for flag, wanted in (("--offsets", args.offsets), ("--sizes", args.sizes)):
            if wanted and not args.json:
                raise InvalidArgumentError(
                    f"{flag} adds to --json's object: add --json, or write the plan with "
                    "--output FILE (- for stdout)"
                )
    except TensorArenaError as exc:
        return _fail(str(exc))
    try:
        # The capacity goes to plan() rather than into the problem, so that the validator below
        # checks the geometry alone and a plan that misses the capacity can still be reported.
        # A Path, so that a file name is never read as CSV text.
        loaded = load_problem(source if source == "-" else Path(source), input_shapes=shapes)
    except TensorArenaError as exc:
        message = str(exc)
        shown = "<stdin>" if source == "-" else source  # as csv_io names stdin
        return _fail(message if shown in message else f"{shown}: {message}")
    problem = loaded.problem if isinstance(loaded, GraphProblem) else loaded

    start = time.perf_counter()
    fits, impossible = True, False
    label = f"{len(problem)} buffers with {args.planner}"
    try:
        with _ProgressLine(label, not args.quiet) as progress:
            result = plan(problem, args.planner, capacity=capacity, time_limit=time_limit,
                          node_limit=node_limit, work_limit=work_limit,
                          alignment=alignment, gap=args.gap,
                          minimize=args.minimize, progress=progress, params=params,
                          repair=args.repair)
    except PlanDoesNotFitError as exc:
        result, fits, impossible = exc.plan, False, exc.proven
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

    peak = problem.lower_bound()
    bound = peak if result.statistics is None else max(peak, result.statistics.bound)
    height = result.height
    ratio = height / peak if peak else (1.0 if height == 0 else float("inf"))
    summary: dict[str, Any] = {
        "buffers": len(problem),
        "lower_bound": peak,
        "bound": bound,
        "height": height,
        "ratio": ratio,
        "optimal": bool(result.optimal or height <= bound),
        "feasible": fits,
        "impossible": impossible,
        "planner": result.planner,
        "seconds": seconds,
        "validate_seconds": validate_seconds,
        **_budget_used(result.statistics),
    }
    if args.offsets:
        summary["offsets"] = result.as_dict()
    if args.sizes:
        summary["sizes"] = {buffer.id: buffer.nbytes for buffer in problem.buffers}
    if args.out is not None and fits:
        try:
            write_solution(result, sys.stdout if args.out == "-" else args.out)
        except OSError as exc:
            return _fail(f"cannot write {args.out}: {exc.strerror or exc}")
    if args.json:
        print(json.dumps(summary))
    elif args.out != "-":
        _print_summary(source, args.out, summary, capacity, result.statistics)
    if not fits and capacity is not None:
        named = capacity_from_name(source) if source != "-" else None
        slip = _unit_slip(args.capacity, capacity, peak, named)
        if slip:
            print(f"tensorarena plan: note: {slip}", file=sys.stderr)
    return 0 if fits else 1


def _node_limit(text: str, *, flag: str = "--node-limit", unit: str = "nodes") -> int | None:
    """``--node-limit`` (or ``flag``): a non-negative int, or ``none`` for no budget."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgumentError(
            f"{flag} must be a non-negative number of {unit} or none, got {text!r}"
        )
    return value


def _budget_used(statistics: PlanStatistics | None) -> dict[str, Any]:
    """What ended the search and what it used of each limit, for the JSON summary."""
    if statistics is None:
        return {"stopped_by": "not_run", "nodes": 0, "node_limit": None, "work": 0,
                "work_limit": None, "time_limit": None}
    limit = statistics.time_limit
    return {"stopped_by": statistics.stopped_by.value, "nodes": statistics.nodes,
            "node_limit": statistics.node_limit, "work": statistics.work,
            "work_limit": statistics.work_limit,
            "time_limit": limit if limit != float("inf") else None}


def _print_summary(source: str, out: str | None, summary: dict[str, Any],
                   capacity: int | None, statistics: PlanStatistics | None) -> None:
    height = summary["height"]
    bound = summary["bound"]
    lines = [
        f"problem      {source} ({summary['buffers']} buffers)",
        f"planner      {summary['planner']}",
        f"lower bound  {summary['lower_bound']} ({format_size(summary['lower_bound'])})"
        + (f"; {bound} with alignment padding and proofs" if bound > summary["lower_bound"]
           else ""),
        f"height       {height} ({format_size(height)}), {summary['ratio']:.4f} x lower bound"
        + (", optimal" if summary["optimal"] else ""),
    ]
    if capacity is not None:
        if summary["feasible"]:
            verdict = "fits"
        elif bound > capacity:
            verdict = (f"DOES NOT FIT: proven impossible, no plan is below {bound} bytes "
                       "(the best plan found is shown)")
        elif summary["impossible"]:
            verdict = ("DOES NOT FIT: proven impossible, the exact search tried every plan "
                       "(the best plan found is shown)")
        else:
            verdict = ("DOES NOT FIT: no plan found that fits within the time limit, not "
                       "proven impossible (the best plan found is shown)")
        lines.append(f"capacity     {capacity} ({format_size(capacity)}): {verdict}")
    lines.append(f"time         {summary['seconds']:.3f} s planning, "
                 f"{summary['validate_seconds']:.3f} s validating")
    if statistics is not None and statistics.exact_skipped:
        lines.append("note         exact search skipped: too many overlapping pairs for the time "
                     "limit (raise --time-limit, or --planner exact to search anyway)")
    elif statistics is not None and statistics.nodes:
        budget = "" if statistics.node_limit is None else f" of {statistics.node_limit}"
        work = "" if statistics.work_limit is None else (
            f", {statistics.work} of {statistics.work_limit} work units")
        lines.append(f"search       {statistics.nodes}{budget} nodes{work}, ended by "
                     f"{statistics.stopped_by.value.replace('_', ' ')}")
    if out is not None:
        written = out if summary["feasible"] else "not written (the plan does not fit)"
        lines.append(f"solution     {written}")
    print("\n".join(lines))
