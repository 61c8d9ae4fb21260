"""``tensorarena trace record|convert|info``: make, convert and describe allocation traces.

* ``tensorarena trace record [-o out.csv] -- python my_script.py ARGS`` runs the script (or
  ``python -m module``) under PyTorch's profiler and writes every allocation it made, torch's
  and tensorarena's pools' (``allocator`` column; ``--no-tensorarena`` for torch's only), each
  with its Python site (``--stack-depth N`` frames, default 8; 0 for none)
  (:func:`tensorarena.trace.run_script`; ``-o`` defaults to ``SCRIPT.trace.csv``). The trace is
  written however the script ends: one that raises, exits non-zero or is interrupted (Ctrl-C,
  SIGTERM) leaves the trace of what it did, marked partial (a ``# partial: why`` line in our
  CSV), and the exit status is the script's (130 for Ctrl-C, 143 for SIGTERM). The file appears
  whole or not at all (written atomically). The script runs in this interpreter; where the
  interpreter named after ``--`` is another one, the recording runs under that one.
* ``tensorarena trace convert IN -o OUT [--to FORMAT]`` reads any format (detected from the
  content) and writes ``csv``, ``rmm`` or ``pytorch_snapshot`` (default: from OUT's suffix,
  ``.pickle``/``.pkl`` a snapshot, else our CSV) — open a snapshot at pytorch.org/memory_viz.
* ``tensorarena trace info TRACE [--json]`` prints what a trace adds up to.

Exit status 2 for a malformed trace or a bad option, as one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from tensorarena.errors import InvalidArgumentError, TensorArenaError
from tensorarena.sizes import format_size

if TYPE_CHECKING:
    from tensorarena.trace.model import Trace

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``trace`` command's subcommands."""
    from tensorarena.trace.formats import FORMATS

    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    record = actions.add_parser("record", help="record a Python program's allocations",
                                description="Run a Python program under PyTorch's profiler "
                                "and write every allocation it made, torch's and "
                                "tensorarena's, with its Python site.")
    record.add_argument("-o", "--output", metavar="OUT",
                        help="trace file to write (.csv, .log for RMM's, .pickle a snapshot; "
                             "default SCRIPT.trace.csv)")
    record.add_argument("--to", choices=FORMATS, help="format (default: from OUT's suffix)")
    record.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="whose allocator to record (default cpu)")
    record.add_argument("--stack-depth", type=int, default=8, metavar="N",
                        help="Python frames kept per allocation, its site (0: none; default 8)")
    record.add_argument("--no-tensorarena", dest="tensorarena", action="store_false",
                        help="record torch's allocator only, not tensorarena's pools")
    record.add_argument("program", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ...",
                        help="the program: python SCRIPT [ARGS] or python -m MODULE [ARGS]")
    convert = actions.add_parser("convert", help="convert a trace between formats")
    convert.add_argument("input", metavar="IN")
    convert.add_argument("-o", "--output", required=True, metavar="OUT")
    convert.add_argument("--to", choices=FORMATS, help="format (default: from OUT's suffix)")
    info = actions.add_parser("info", help="what a trace adds up to")
    info.add_argument("input", metavar="TRACE")
    info.add_argument("--json", action="store_true", help="one JSON object")


#: The format each output suffix means, where ``--to`` does not say.
_SUFFIXES = {".csv": "csv", ".txt": "csv", ".log": "rmm", ".pickle": "pytorch_snapshot",
             ".pkl": "pytorch_snapshot"}


def _format(output: str, chosen: str | None) -> str:
    """``--to``, else the format ``output``'s suffix names; an unknown suffix is refused (a
    typo in ``-o`` must not silently write our CSV)."""
    if chosen:
        return chosen
    suffix = Path(output).suffix.lower()
    if suffix not in _SUFFIXES:
        raise InvalidArgumentError(
            f"cannot tell the format from {output!r}: name the file {', '.join(_SUFFIXES)} "
            f"(.log is RMM's CSV, .pickle a PyTorch snapshot), or say --to FORMAT")
    return _SUFFIXES[suffix]


def _interpreter_and_program(words: list[str]) -> tuple[str | None, list[str]]:
    """The interpreter named (None: none was) and what follows it: the script or
    ``-m module``, and their arguments."""
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise InvalidArgumentError("no program to record: tensorarena trace record -o OUT -- "
                               "python SCRIPT [ARGS]")
    interpreter = None
    first = Path(words[0]).name
    if first.startswith("python") or words[0] == sys.executable:
        interpreter, words = words[0], words[1:]
    if words and words[0].startswith("-") and words[0] != "-m":
        raise InvalidArgumentError(f"trace record runs 'python SCRIPT' or 'python -m MODULE'; "
                                   f"the interpreter option {words[0]!r} is not supported")
    elif not words[0].endswith(".py") and words[0] != "-m":
        raise InvalidArgumentError(f"trace record runs Python programs: give 'python SCRIPT' or "
                               f"'python -m MODULE', not {words[0]!r}")
    return interpreter, words


def _another_interpreter(named: str | None) -> str | None:
    """The path of the interpreter named after ``--`` where it is not this one, else None."""
    if named is None:
        return None
    found = shutil.which(named)
    if found is None:
        raise InvalidArgumentError(f"no interpreter {named!r} on PATH")
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return None
    if subprocess.call([found, "-c", "import tensorarena"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL) != 0:
        raise InvalidArgumentError(
            f"{named!r} is {found}, which cannot import tensorarena: install it there, or name "
            f"this interpreter ({sys.executable}) after --")
    return found


def _default_output(program: list[str]) -> str:
    target = program[1] if program[0] == "-m" else program[0]
    return f"{Path(target).stem if target.endswith('.py') else target}.trace.csv"


def _record(args: argparse.Namespace) -> int:
    """``trace record``: the script's trace written however it ends; the script's status."""
    from tensorarena.trace.atomic import check_writable
    from tensorarena.trace.formats import write_trace
    from tensorarena.trace.torch_recorder import run_script

    named, program = _interpreter_and_program(list(args.program))
    output = args.output or _default_output(program)
    fmt = _format(output, args.to)
    check_writable(output)  # now, not after the whole program has run
    other = _another_interpreter(named)
    if other is not None:  # record under the interpreter the user named, with its packages
        # The program alone after --: the child runs it itself. Naming the interpreter again
        # would make a wrapper (pyenv's shim, a venv's link to a script) delegate forever, as
        # its real path is never the child's own sys.executable.
        command = [other, "-m", "tensorarena", "trace", "record", "-o", output,
                   "--device", args.device, "--stack-depth", str(args.stack_depth),
                   *(["--to", args.to] if args.to else []),
                   *([] if args.tensorarena else ["--no-tensorarena"]), "--", *program]
        with contextlib.suppress(KeyboardInterrupt):  # the child gets Ctrl-C too, and ends
            return subprocess.call(command)
        return 130
    run = run_script(program, device=args.device, pools=args.tensorarena,
                     stack_depth=args.stack_depth)
    if run.error is not None and not isinstance(run.error, SystemExit):
        traceback.print_exception(run.error)
    write_trace(run.trace, output, format=fmt)  # type: ignore[arg-type]
    summary = run.trace.summary()
    partial = run.trace.metadata.get("partial")
    print(f"recorded {summary.allocations} allocations{_by_allocator(run.trace)} "
          f"({summary.events} events, peak live {format_size(summary.peak_live_bytes)}) to "
          f"{output}"
          + (f"; partial: {partial}" if partial else ""), file=sys.stderr)
    return run.exit_status


def _allocators(trace: Trace) -> dict[str, int]:
    """Allocations per named allocator (empty for a trace that names none)."""
    counts: dict[str, int] = {}
    for event in trace:
        if event.op == "a" and event.allocator:
            counts[event.allocator] = counts.get(event.allocator, 0) + 1
    return counts


def _by_allocator(trace: Trace) -> str:
    counts = _allocators(trace)
    return f" ({', '.join(f'{n} {name}' for name, n in counts.items())})" if counts else ""


def _fail(message: str) -> int:
    print(f"tensorarena trace: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; return the exit status."""
    from tensorarena.trace.formats import read_trace, write_trace

    try:
        if args.action == "record":
            return _record(args)
        trace = read_trace(args.input)
        if args.action == "convert":
            write_trace(trace, args.output, format=_format(args.output, args.to))  # type: ignore[arg-type]
            return 0
        summary = trace.summary()
        if args.json:
            print(json.dumps({"name": trace.name, **summary.as_dict(),
                              "allocators": _allocators(trace),
                              "metadata": dict(trace.metadata)}))
            return 0
        print(f"{trace.name} ({trace.metadata.get('format', '?')}): {summary.events} events, "
              f"{summary.allocations} allocations{_by_allocator(trace)}, {summary.frees} "
              f"frees, {summary.streams} stream(s)")
        print(f"peak live {format_size(summary.peak_live_bytes)} in "
              f"{summary.peak_live_blocks} blocks (at event {summary.peak_event}); largest "
              f"{format_size(summary.largest_bytes)}; {format_size(summary.total_bytes)} "
              f"allocated in all; {summary.live_at_end_blocks} never freed "
              f"({format_size(summary.live_at_end_bytes)})")
        return 0
    except TensorArenaError as exc:
        return _fail(str(exc))
