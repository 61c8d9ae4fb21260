"""Every code block of the README and of the documentation site (docs/) runs as a test.

Sybil collects the Markdown files: each ```python block runs in the namespace of its page, top to
bottom (a page reads as one program, as a reader would paste it), and each ```console block runs
its ``$ tensorarena ...`` lines through the command's own ``main`` and expects exit status 0. A
page runs in an empty temporary folder of its own, so files it writes go nowhere else.
Other fences (``bash`` for ``make``, ``text`` for output) are shown, not run.

A block that needs what a test machine may not have says so just above itself, in a comment
Sybil reads: ``<!-- skip: next if(not gpu("cupy"), reason="needs a CUDA GPU and CuPy") -->``.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import tempfile
from typing import Any

from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser


def gpu(*modules: str) -> bool:
    """A CUDA GPU is visible and every module named is installed."""
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return False
        except ImportError:  # a parent package is missing ("numba" for "numba.cuda")
            return False
    try:
        from tensorarena.memory.cuda import cuda_available
    except ImportError:
        return False
    return bool(cuda_available())


def _run_console(example: Example) -> None:
    from tensorarena.cli.main import main

    for line in example.parsed.splitlines():
        if not line.startswith("$ "):
            continue  # output shown under the command
        words = shlex.split(line[2:], comments=True)
        assert words[0] == "tensorarena", f"only tensorarena commands run: {line!r}"
        try:
            status = main(words[1:])
        except SystemExit as done:  # --help and --version exit through argparse
            status = done.code or 0
        assert status == 0, f"{line!r} exited {status}"


def _setup(namespace: dict[str, Any]) -> None:
    namespace["_cwd"] = os.getcwd()
    namespace["_folder"] = tempfile.mkdtemp(prefix="tensorarena-docs-")
    namespace["gpu"] = gpu
    os.chdir(namespace["_folder"])


def _teardown(namespace: dict[str, Any]) -> None:
    os.chdir(namespace["_cwd"])
    shutil.rmtree(namespace["_folder"], ignore_errors=True)
    namespace.clear()  # the page's arrays, pools and programs go before the next page runs


pytest_collect_file = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="console", evaluator=_run_console),
        SkipParser(),
    ],
    patterns=["README.md", "docs/*.md", "docs/**/*.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
