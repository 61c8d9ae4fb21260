"""The README and the documentation pages keep the shape their tests rely on.

Their code blocks are run by Sybil (the root conftest.py), which runs only ```python and
```console fences: these guards make sure no block escapes that run under another tag, that the
README opens with the two commands, and that every page is in the site's navigation.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: run by the tests: python, console ($ tensorarena ... lines); shown only: bash (make and pip,
#: which install), text (output, layouts) and an untagged fence (the README's two commands).
TAGS = {"python", "console", "bash", "text", ""}
TWO_COMMANDS = (
    "make run    # installs into .venv and runs the main job: GPT-2 124M eagerly and in one "
    "planned arena, side by side\n"
    "make test   # installs into .venv (the dev, torch, models, onnx, viz and plot extras) and "
    "runs every test\n"
)


def test_the_pages_are_found() -> None:
    assert len(PAGES) >= 15, PAGES


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_fence_is_run_or_only_shown(path: Path) -> None:
    for fence in FENCE.finditer(path.read_text("utf-8")):
        tag, body = fence.group(1).strip(), fence.group(2)
        assert tag in TAGS, f"{path.name}: a ```{tag} block would escape the tests"
        if tag in ("bash", ""):
            commands = [line for line in body.splitlines() if line.strip()]
            assert all(line.split()[0] in ("make", "pip") for line in commands), (
                f"{path.name}: only make and pip commands may be shown without running: {body!r}"
            )
        if tag == "console":
            assert any(line.startswith("$ tensorarena ") for line in body.splitlines()), body


def test_the_readme_opens_with_the_two_commands() -> None:
    first = next(FENCE.finditer((ROOT / "README.md").read_text("utf-8")))
    assert first.group(2) == TWO_COMMANDS


def test_the_fence_check_refuses_an_escaping_tag(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# x\n\n```py\nprint(1)\n```\n", "utf-8")
    with pytest.raises(AssertionError, match="escape"):
        test_every_fence_is_run_or_only_shown(page)


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text("utf-8")
    missing = [str(p.relative_to(ROOT / "docs")) for p in PAGES
               if str(p.relative_to(ROOT / "docs")) not in nav]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"
