"""``tensorarena trace record|convert|info``: make, convert and describe allocation traces.

* ``tensorarena trace record -o out.csv -- python my_script.py ARGS`` runs the script (or
  ``python -m module``) in this interpreter under PyTorch's profiler and writes every allocation
  it made (:func:`tensorarena.trace.record_script`). The file appears only once the script has
  finished: a script that fails or is interrupted leaves no trace behind (exit 1 or 130).
* ``tensorarena trace convert IN -o OUT [--to FORMAT]`` reads any format (detected from the
  content) and writes ``csv``, ``rmm`` or ``pytorch_snapshot`` (default: from OUT's suffix,
  ``.pickle``/``.pkl`` a snapshot, else our CSV) — open a snapshot at pytorch.org/memory_viz.
* ``tensorarena trace info TRACE [--json]`` prints what a trace adds up to.

Exit status 2 for a malformed trace or a bad option, as one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from tensorarena.errors import InvalidArgumentError, TensorArenaError
from tensorarena.sizes import format_size

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``trace`` command's subcommands."""
    from tensorarena.trace.formats import FORMATS

    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    record = actions.add_parser("record", help="record a Python program's torch allocations",
                                description="Run a Python program under PyTorch's profiler "
                                "and write every allocation it made.")
    record.add_argument("-o", "--output", required=True, metavar="OUT",
                        help="trace file to write (.csv, .log for RMM's, .pickle a snapshot)")
    record.add_argument("--to", choices=FORMATS, help="format (default: from OUT's suffix)")
    record.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="whose allocator to record (default cpu)")
    record.add_argument("program", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ...",
                        help="the program: python SCRIPT [ARGS] or python -m MODULE [ARGS]")
    convert = actions.add_parser("convert", help="convert a trace between formats")
    convert.add_argument("input", metavar="IN")
    convert.add_argument("-o", "--output", required=True, metavar="OUT")
    convert.add_argument("--to", choices=FORMATS, help="format (default: from OUT's suffix)")
    info = actions.add_parser("info", help="what a trace adds up to")
    info.add_argument("input", metavar="TRACE")
    info.add_argument("--json", action="store_true", help="one JSON object")


def _format(output: str, chosen: str | None) -> str:
    if chosen:
        return chosen
    suffix = Path(output).suffix.lower()
    return {".pickle": "pytorch_snapshot", ".pkl": "pytorch_snapshot",
            ".log": "rmm"}.get(suffix, "csv")


def _program(words: list[str]) -> list[str]:
    """What follows ``python``: the script or ``-m module``, and their arguments."""
    if words[:1] == ["--"]:
        words = words[1:]
    if not words:
        raise InvalidArgumentError("no program to record: tensorarena trace record -o OUT -- "
                               "python SCRIPT [ARGS]")
    first = Path(words[0]).name
    if first.startswith("python") or words[0] == sys.executable:
        words = words[1:]
    if words and words[0].startswith("-") and words[0] != "-m":
        raise InvalidArgumentError(f"trace record runs 'python SCRIPT' or 'python -m MODULE'; "
                                   f"the interpreter option {words[0]!r} is not supported")
    elif not words[0].endswith(".py") and words[0] != "-m":
        raise InvalidArgumentError(f"trace record runs Python programs: give 'python SCRIPT' or "
                               f"'python -m MODULE', not {words[0]!r}")
    return words


def _fail(message: str) -> int:
    print(f"tensorarena trace: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; return the exit status."""
    from tensorarena.trace.formats import read_trace, write_trace

    try:
        if args.action == "record":
            from tensorarena.trace.atomic import check_writable
            from tensorarena.trace.torch_recorder import record_script

            program = _program(list(args.program))
            fmt = _format(args.output, args.to)
            check_writable(args.output)  # now, not after the whole program has run
            try:
                trace = record_script(program, device=args.device)
            except (KeyboardInterrupt, TensorArenaError):
                raise
            except BaseException:  # the program's own failure: its traceback, no trace
                traceback.print_exc()
                print(f"tensorarena trace: the program failed; {args.output} not written",
                      file=sys.stderr)
                return 1
            write_trace(trace, args.output, format=fmt)  # type: ignore[arg-type]
            summary = trace.summary()
            print(f"recorded {summary.allocations} allocations ({summary.events} events, peak "
                  f"live {format_size(summary.peak_live_bytes)}) to {args.output}",
                  file=sys.stderr)
            return 0
        trace = read_trace(args.input)
        if args.action == "convert":
            write_trace(trace, args.output, format=_format(args.output, args.to))  # type: ignore[arg-type]
            return 0
        summary = trace.summary()
        if args.json:
            print(json.dumps({"name": trace.name, **summary.as_dict(),
                              "metadata": dict(trace.metadata)}))
            return 0
        print(f"{trace.name} ({trace.metadata.get('format', '?')}): {summary.events} events, "
              f"{summary.allocations} allocations, {summary.frees} frees, "
              f"{summary.streams} stream(s)")
        print(f"peak live {format_size(summary.peak_live_bytes)} in "
              f"{summary.peak_live_blocks} blocks (at event {summary.peak_event}); largest "
              f"{format_size(summary.largest_bytes)}; {format_size(summary.total_bytes)} "
              f"allocated in all; {summary.live_at_end_blocks} never freed "
              f"({format_size(summary.live_at_end_bytes)})")
        return 0
    except TensorArenaError as exc:
        return _fail(str(exc))
