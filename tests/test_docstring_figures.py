"""House rule: no measured numbers and no issue numbers in docstrings.

Both go stale where nobody looks: a timing measured on one loaded VM, a ratio against a baseline
since changed, "issue 12" after the tracker moved. Figures live in ``bench/RESULTS.md`` with the
script that measured them, and the history in git and CHANGELOG.md; a docstring keeps the
reasoning ("a lookup per call, where the walk was linear"), not the number.

What counts as measured: a duration in ns, µs or ms, or in seconds with a decimal point; a
percentage or a ratio (``5x``) said of speed or size; a number the text says was measured.
Constants of a specification (a 2 MiB huge page, a 1 MiB small-block limit) and code literals
(````"1MiB"````, ````--timeout=10s````) are not figures and pass.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import tensorarena

ROOT = Path(tensorarena.__file__).parent

ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)
MEASURED = re.compile(
    r"\d+(?:\.\d+)?\s?(?:ns|µs|us|ms)\b"  # a duration below the second
    r"|\d+\.\d+\s?s\b"  # seconds with a decimal point
    r"|\d+(?:\.\d+)?\s?%"  # a percentage
    r"|\b\d+(?:\.\d+)?x\b"  # a ratio (not 0x, a hexadecimal prefix)
    r"|measured[^.]{0,40}?\d",  # "measured on ...: 8-13"
    re.IGNORECASE,
)
#: Literal code (````...````) is what a user types, not a figure.
LITERAL = re.compile(r"``.*?``", re.DOTALL)


def _docstrings(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                first = node.body[0]
                found.append((first.lineno, doc))
    return found


def offences(source: str) -> list[str]:
    """``line: text`` for each issue number or measured figure in ``source``'s docstrings."""
    found = []
    for line, doc in _docstrings(ast.parse(source)):
        text = LITERAL.sub(lambda m: "`" * m.group().count("\n"), doc)
        for match in [*ISSUE.finditer(text), *MEASURED.finditer(text)]:
            at = line + text[: match.start()].count("\n")
            found.append(f"{at}: {match.group()!r}")
    return found


MODULES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_docstring_carries_a_measured_number_or_an_issue_number(path: Path) -> None:
    found = offences(path.read_text(encoding="utf-8"))
    assert found == [], f"{path.relative_to(ROOT)}: move figures to bench/RESULTS.md: {found}"


@pytest.mark.parametrize("text", [
    "see issue 12", "fixed in #231", "about 0.4 µs a call", "~150 ns", "took 1.1 s",
    "~10 % faster", "5x slower", "measured on an H200: 8-13 GB/s",
])
def test_the_guard_refuses_a_figure(text: str) -> None:
    assert offences(f'"""{text}."""\n') != []


@pytest.mark.parametrize("text", [
    "regions of 2 MiB or more", "``--timeout=10s``", "``capacity=\"1MiB\"``", "a ``0x`` prefix",
    "up to ``time_limit`` seconds", "one fault per 2 MiB instead of per 4 KiB",
])
def test_the_guard_passes_constants_and_code(text: str) -> None:
    assert offences(f'"""{text}."""\n') == []
