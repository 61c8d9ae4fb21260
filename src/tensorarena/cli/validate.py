"""``tensorarena validate PROBLEM SOLUTION``: check a plan made by anyone, with our validator.

SOLUTION is a minimalloc solution CSV (the problem's columns plus ``offset``), matched to the
problem's buffers by id; either file may be ``-`` for stdin (not both). The check is
:func:`~tensorarena.planning.validate.validate`, which shares no code with any planner. Exit
status, as scripts need it: 0 valid (the height is printed), 1 invalid (the first conflict is
named: two buffers live at once that share bytes, a misaligned or negative offset, a buffer past
``--capacity``), 2 malformed input (a file that cannot be read or parsed, a solution that does not
match the problem), always one line on stderr, never a traceback. ``--json`` prints one object:
``{"valid": bool, "height": int, "lower_bound": int, "buffers": int, "error": str | null}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tensorarena.errors import InvalidPlanError, TensorArenaError
from tensorarena.sizes import SIZE_RULE, parse_size

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``validate`` command's arguments."""
    parser.epilog = (
        f"Sizes (--capacity): {SIZE_RULE}. Exit status: 0 valid; 1 invalid (the first conflict "
        "is named); 2 malformed input."
    )
    parser.add_argument("problem", metavar="PROBLEM.csv", help="minimalloc CSV problem (- stdin)")
    parser.add_argument("solution", metavar="SOLUTION.csv",
                        help="minimalloc solution CSV: the problem's rows with an offset column")
    parser.add_argument("--capacity", metavar="N", help="also check that the plan fits N bytes")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")


def _fail(message: str) -> int:
    print(f"tensorarena validate: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the command; return the exit status (0 valid, 1 invalid, 2 malformed input)."""
    from pathlib import Path

    from tensorarena.planning.csv_io import read_problem, read_solution
    from tensorarena.planning.validate import validate

    if args.problem == "-" and args.solution == "-":
        return _fail("only one of PROBLEM and SOLUTION can be read from stdin")
    try:
        capacity = (None if args.capacity is None
                    else parse_size(args.capacity, name="--capacity", allow_zero=True))
    except TensorArenaError as exc:
        return _fail(str(exc))
    # Each file's errors name it: a bad line could be in either, and stdin in both.
    source = args.problem
    try:
        problem = read_problem(sys.stdin if source == "-" else Path(source))
        source = args.solution
        plan = read_solution(sys.stdin if source == "-" else Path(source), problem)
    except TensorArenaError as exc:
        kind = "problem" if source is args.problem else "solution"
        shown = "<stdin>" if source == "-" else source
        message = str(exc)
        return _fail(f"{kind}: {message}" if shown in message else f"{kind} {shown}: {message}")
    error: str | None = None
    try:
        validate(problem, plan, capacity=capacity)
    except InvalidPlanError as exc:
        error = str(exc)
    report: dict[str, Any] = {"valid": error is None, "height": plan.height,
                              "lower_bound": problem.lower_bound(), "buffers": len(problem),
                              "error": error}
    if args.json:
        print(json.dumps(report))
    elif error is None:
        fits = "" if capacity is None else f", fits {capacity}"
        print(f"valid: {len(problem)} buffers, height {plan.height} "
              f"(lower bound {report['lower_bound']}){fits}")
    else:
        print(f"INVALID: {error}")
    return 0 if error is None else 1
