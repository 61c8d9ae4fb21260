"""load_problem: one door for CSV, stdin, ONNX and saved torch.export programs."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import tensorarena.cli.main as cli_main
from tensorarena.errors import InvalidArgumentError, InvalidProblemError
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.problem import Problem
from tensorarena.planning.sources import load_problem, parse_input_shape

DATA = Path(__file__).parent / "data"


def test_csv_by_path_and_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    by_path = load_problem(DATA / "toy.12.csv")
    assert isinstance(by_path, Problem) and len(by_path) == 5
    monkeypatch.setattr(sys, "stdin", io.StringIO((DATA / "toy.12.csv").read_text()))
    from_stdin = load_problem("-")
    assert isinstance(from_stdin, Problem) and from_stdin.buffers == by_path.buffers
    with pytest.raises(InvalidArgumentError, match="input shapes apply to graphs"):
        load_problem(DATA / "toy.12.csv", input_shapes={"x": (1,)})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("ids=8,128", ("ids", (8, 128))), (" x = 3 ", ("x", (3,))), ("s=", ("s", ()))],
)
def test_parse_input_shape(text: str, expected: tuple[str, tuple[int, ...]]) -> None:
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["ids", "=8", "ids=8,-1", "ids=a,b"])
def test_a_bad_input_shape_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError, match="input shape"):
        parse_input_shape(text)


@pytest.fixture(scope="module")
def saved_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.linear(x)) * 2 + 1

    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(Block(), (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    path = tmp_path_factory.mktemp("pt2") / "block.pt2"
    torch.export.save(program, str(path))
    return path


@pytest.mark.torch
def test_a_saved_program_plans_for_the_shape_given(saved_program: Path) -> None:
    small = load_problem(saved_program, input_shapes={"x": (4, 8)})
    large = load_problem(saved_program, input_shapes={"x": (16, 8)})
    assert isinstance(small, GraphProblem) and isinstance(large, GraphProblem)
    assert small.name == "block"
    assert large.lower_bound() == 4 * small.lower_bound()
    with pytest.raises(InvalidProblemError, match="symbolic size"):
        load_problem(saved_program)  # a dynamic batch must be pinned
    for shapes, words in (({"y": (4, 8)}, "not an input"), ({"x": (4,)}, "rank 2"),
                          ({"x": (4, 9)}, "axis 1 is 8")):
        with pytest.raises(InvalidProblemError, match=words):
            load_problem(saved_program, input_shapes=shapes)


@pytest.mark.torch
def test_plan_a_saved_program_from_the_command_line(
    saved_program: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["plan", str(saved_program), "--input-shape", "x=4,8", "--json"]
    assert cli_main.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["feasible"] and summary["height"] >= summary["lower_bound"] > 0
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    assert cli_main.main(["plan", str(junk)]) == 2
    assert "not a saved torch.export program" in capsys.readouterr().err
