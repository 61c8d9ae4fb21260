"""MkDocs hook: the command-line reference, rendered from the argparse parsers themselves.

A page that holds the line ``<!-- cli-reference -->`` gets, in its place, one section per command
of :data:`tensorarena.cli.main.COMMANDS` and per benchmark of ``BENCHMARKS``, each the ``--help``
text of a parser built the way ``tensorarena`` builds it (the command module's ``configure``),
and one more for every subcommand (``trace record``, ...). Nothing is written by hand, so the page
cannot drift from the options the program accepts.
"""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Any

MARKER = "<!-- cli-reference -->"


def _parser(prog: str, module: str, help_text: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=help_text)
    importlib.import_module(module).configure(parser)
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    # argparse keeps subcommands in its (documented-by-use, undocumented-by-name) action list;
    # sphinx-argparse and mkdocs' argparse plugins walk it the same way.
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.items())
    return found


def _section(level: int, title: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"{'#' * level} `{title}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, sub in _subparsers(parser):
        lines += _section(level + 1, f"{title} {name}", sub)
    return lines


def render() -> str:
    """The Markdown of every command's and benchmark's help."""
    from tensorarena.cli.main import BENCHMARKS, COMMANDS

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix the width for the page
    lines = ["| command | does |", "|---|---|"]
    lines += [f"| [`{name}`](#tensorarena-{name}) | {help_text} |"
              for name, (_, help_text) in COMMANDS.items()]
    lines += [f"| [`bench {name}`](#tensorarena-bench-{name}) | {help_text} |"
              for name, (_, help_text) in BENCHMARKS.items()]
    lines += ["", "`tensorarena --version` prints the version, the build (compiled or pure) and "
              "the Python and NumPy it runs on.", ""]
    for name, (module, help_text) in COMMANDS.items():
        lines += _section(2, f"tensorarena {name}",
                          _parser(f"tensorarena {name}", module, help_text))
    lines += ["## `tensorarena bench`", "",
              "Each benchmark prints its table; `bench/RESULTS.md` (the "
              "[benchmarks page](benchmarks.md)) has the numbers measured with them.", ""]
    for name, (module, help_text) in BENCHMARKS.items():
        lines += _section(3, f"tensorarena bench {name}",
                          _parser(f"tensorarena bench {name}", module, help_text))
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
