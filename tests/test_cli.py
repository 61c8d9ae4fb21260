"""The ``tensorarena`` command: no traceback for anything a user can cause."""

from __future__ import annotations

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


def test_ctrl_c_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorarena.bench import alloc

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(alloc, "run", interrupted)
    assert cli.main(["bench", "alloc"]) == 130
    assert capsys.readouterr().err == "tensorarena: interrupted\n"
