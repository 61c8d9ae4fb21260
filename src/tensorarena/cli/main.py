"""``tensorarena`` — entry point. Each command lives in its own module, imported only when used.

A command module exposes ``configure(parser)`` (add its arguments) and ``run(args) -> int`` (the
exit status). ``bench`` has one module per benchmark under :mod:`tensorarena.bench`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]

#: command → (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("tensorarena.cli.plan", "plan offsets for a problem CSV (static memory planning)"),
    "validate": ("tensorarena.cli.validate", "check a solution CSV against its problem CSV"),
    "demo": ("tensorarena.cli.demo", "GPT-2 124M eager and planned, side by side; report"),
    "viz": ("tensorarena.cli.viz", "a memory timeline of a trace or snapshot, as HTML/PNG"),
    "replay": ("tensorarena.cli.replay", "replay an allocation trace on every strategy; compare"),
    "trace": ("tensorarena.cli.trace", "record, convert and describe allocation traces"),
}

#: benchmark → (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "alloc": ("tensorarena.bench.alloc", "allocate/free latency and footprint of every strategy"),
    "reuse": ("tensorarena.bench.reuse", "pooled arrays vs np.empty: page-fault reuse"),
    "threads": ("tensorarena.bench.threads", "allocation throughput across threads"),
    "plan": ("tensorarena.bench.plan", "planners on the public suites and real models"),
    "schedule": ("tensorarena.bench.schedule", "memory-aware reordering of real models' graphs"),
    "exec": ("tensorarena.bench.exec", "models eager, planned and compiled: memory, latency"),
    "replay": ("tensorarena.bench.replay", "shipped traces on every strategy; replay speed"),
    "adaptors": ("tensorarena.bench.adaptors", "what each debugging adaptor costs per pair"),
    "pool-pair": ("tensorarena.bench.pool_pair", "a pool's pair: one arena vs a fragmented first"),
    "thread-cache": ("tensorarena.bench.thread_cache", "ThreadCached's hit path, ns per pair"),
    "outputs": ("tensorarena.bench.outputs", "fresh vs handed-over outputs, calls interleaved"),
    "learned": ("tensorarena.bench.learned", "plans learned from repeating steps, replayed"),
    "eager": ("tensorarena.bench.eager", "real eager loops under torch.learned() vs pools, glibc"),
    "torch-use": ("tensorarena.bench.torch_use",
                  "one torch allocation under tensorarena.torch.use vs torch's own"),
}


class _VersionAction(argparse.Action):
    """``--version``: the package's version, its build (compiled or pure: see
    :func:`tensorarena._version.build`) and the Python and NumPy it runs on, then exit.

    An action rather than ``action="version"`` so that NumPy is imported only when asked.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        import platform

        import numpy

        from tensorarena._version import __version__, build

        # To stdout, as argparse's own version action: parser.exit(message=...) writes stderr.
        print(
            f"tensorarena {__version__} (Python {platform.python_version()}, "
            f"NumPy {numpy.__version__}, {build()} build)"
        )
        parser.exit()


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Build the parser, importing only the module of the command ``argv`` names.

    Every command is listed (for ``--help``), but only the chosen one is configured, so a command
    never pays for, or breaks on, another command's imports.
    """
    words = [word for word in argv if not word.startswith("-")]
    parser = argparse.ArgumentParser(
        prog="tensorarena", description="The memory manager of a machine-learning runtime."
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module)
        if words[:1] == [name]:
            importlib.import_module(module).configure(sub)
    bench = commands.add_parser("bench", help="run a benchmark and print its table")
    benchmarks = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module, help_text) in BENCHMARKS.items():
        sub = benchmarks.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module)
        if words[:2] == ["bench", name]:
            importlib.import_module(module).configure(sub)
    return parser


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush into the closed pipe
    raises nothing ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status.

    Bad input never ends in a traceback: a :class:`~tensorarena.errors.TensorArenaError` that
    a command lets through is printed as one line and exits 2, and so is an ``OSError`` (a file
    that cannot be read or written: ``-o`` naming a folder, a full disk); Ctrl-C exits 130
    (128 + SIGINT).
    """
    from tensorarena.errors import TensorArenaError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _build_parser(argv).parse_args(argv)
        status: int = importlib.import_module(args._module).run(args)
    except KeyboardInterrupt:
        print("tensorarena: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as a pipe's tools do
        _drop_stdout()
        return 128 + 13  # SIGPIPE
    except (TensorArenaError, OSError) as error:
        print(f"tensorarena: error: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
