"""The ``tensorarena`` command: no traceback for anything a user can cause."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorarena.cli import main as cli
from tensorarena.errors import InvalidSizeError


def test_an_error_a_command_lets_through_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorarena.bench import alloc

    def refuse(args: object) -> int:
        raise InvalidSizeError("capacity -5 must be positive")

    monkeypatch.setattr(alloc, "run", refuse)
    assert cli.main(["bench", "alloc"]) == 2
    err = capsys.readouterr().err
    assert err == "tensorarena: error: capacity -5 must be positive\n"


def test_an_output_path_that_is_a_folder_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("plotly")  # viz draws with plotly before it writes
    trace = tmp_path / "t.csv"
    trace.write_text("op,id,size\na,1,5\nf,1,\n", encoding="utf-8")
    assert cli.main(["viz", str(trace), "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensorarena: error: ") and "directory" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_ctrl_c_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorarena.bench import alloc

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(alloc, "run", interrupted)
    assert cli.main(["bench", "alloc"]) == 130
    assert capsys.readouterr().err == "tensorarena: interrupted\n"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    import subprocess
    import sys

    # disjoint lifetimes: planned at once, and the offsets run to well over a pipe's buffer
    problem = tmp_path / "many.csv"
    problem.write_text("id,lower,upper,size\n" + "".join(
        f"{i},{i},{i + 1},{64 + i % 7}\n" for i in range(20000)))
    child = subprocess.Popen(
        [sys.executable, "-m", "tensorarena", "plan", str(problem), "--json", "--offsets"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.read(100)  # | head -c 100
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 141 and err == ""
