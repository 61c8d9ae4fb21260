"""README.md's Python snippets run as written, pasted top to bottom into one fresh interpreter.

Every ```python block, in order, becomes one script run in a subprocess whose working directory
is an empty temporary folder (so nothing leans on the checkout). Each block keeps its README line
numbers (the gaps are blank lines), so a traceback points at the README line that broke. Other
fences (```, shell commands and output) are not run.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def readme_script(text: str) -> tuple[str, int]:
    """The ```python blocks of ``text`` as one script with their own line numbers, and how many."""
    lines: list[str] = []
    blocks = 0
    for fence in FENCE.finditer(text):
        if fence.group(1).strip() != "python":
            continue
        first = text.count("\n", 0, fence.start(2)) + 1  # README line of the block's first line
        lines.extend([""] * (first - 1 - len(lines)))
        lines.extend(fence.group(2).splitlines())
        blocks += 1
    return "\n".join(lines) + "\n", blocks


def test_script_keeps_readme_line_numbers() -> None:
    text = "# title\n\n```python\nx = 1\n```\n\n```\n$ shell\n```\n\n```python\ny = x\n```\n"
    script, blocks = readme_script(text)
    assert blocks == 2
    assert script.splitlines()[3] == "x = 1"  # README line 4
    assert script.splitlines()[11] == "y = x"  # README line 12
    assert "$ shell" not in script


def test_every_python_fence_is_marked_python() -> None:
    # A block tagged ``py`` or ``python3`` would silently escape the run below.
    tags = {fence.group(1).strip() for fence in FENCE.finditer(README.read_text("utf-8"))}
    assert not {tag for tag in tags if tag.startswith("py") and tag != "python"}, tags


@pytest.mark.torch
def test_readme_snippets_run(tmp_path: Path) -> None:
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:  # the README's planning snippet needs the models extra; make test installs it
        pytest.skip(f"README snippets need {', '.join(missing)} (the models extra)")
    script, blocks = readme_script(README.read_text("utf-8"))
    assert blocks >= 3, "README.md lost its ```python blocks"
    path = tmp_path / "README_snippets.py"
    path.write_text(script, "utf-8")
    done = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (
        f"README.md's snippets failed (line numbers are README.md's):\n{done.stderr[-4000:]}"
    )
