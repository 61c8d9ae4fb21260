"""The command line minimalloc users know: its flags, stdin, offsets, validate, verdicts."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

import tensorarena.cli.main as cli_main
from tensorarena.planning.csv_io import read_problem, read_solution
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"
TOY = DATA / "toy.12.csv"  # 5 buffers, optimum 12


def test_minimalloc_flags_plan_and_write_the_solution(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "solution.csv"
    argv = ["plan", f"--input={TOY}", f"--output={out}", "--capacity=12", "--timeout=10s",
            "--validate", "--section_inference=false", "--nocheck_dominance",
            "--preordering_heuristics=WAT,TAW", "--json"]
    assert cli_main.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["height"] == 12 and summary["feasible"]
    problem = read_problem(TOY)
    validate(problem, read_solution(out, problem), capacity=12)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--timeout=soon"], "--timeout must be a duration"),
        (["--preordering_heuristics=WAX"], "preorders"),
        ([f"--input={DATA / 'pisarchyk_lee.csv'}"], "two problems given"),
        (["--output=-", "--json"], "both want stdout"),
        (["--input-shape", "x"], "NAME=D,D"),
    ],
)
def test_bad_minimalloc_flags_exit_2(capsys: pytest.CaptureFixture[str], extra: list[str],
                                     words: str) -> None:
    assert cli_main.main(["plan", str(TOY), *extra]) == 2
    assert words in capsys.readouterr().err


def test_a_boolean_flag_that_is_not_a_boolean_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        cli_main.main(["plan", str(TOY), "--canonical_only=maybe"])
    assert info.value.code == 2


def test_no_problem_at_all_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plan"]) == 2
    assert "no problem given" in capsys.readouterr().err


def test_stdin_in_and_the_solution_on_stdout(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(TOY.read_text()))
    assert cli_main.main(["plan", "-", "--output=-"]) == 0
    out = capsys.readouterr().out
    problem = read_problem(TOY)
    validate(problem, read_solution(out, problem))  # stdout holds the CSV alone


def test_json_with_offsets(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plan", str(TOY), "--json", "--offsets"]) == 0
    summary = json.loads(capsys.readouterr().out)
    offsets = summary["offsets"]
    assert set(offsets) == {"b1", "b2", "b3", "b4", "b5"}
    problem = read_problem(TOY)
    from tensorarena.planning.problem import Plan

    validate(problem, Plan(problem, tuple(offsets[b.id] for b in problem.buffers)))


def test_a_capacity_below_the_bound_is_proven_impossible_and_the_best_plan_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main.main(["plan", str(TOY), "--capacity", "11"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT: proven impossible, no plan is below 12 bytes" in out
    assert "height       12" in out  # the best plan is still reported
    assert cli_main.main(["plan", str(TOY), "--capacity", "11", "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["impossible"] and not summary["feasible"] and summary["height"] == 12


def test_impossible_above_the_bound_says_the_search_proved_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Lower bound 2, but 4-aligned offsets put any plan at 5 or more.
    path = tmp_path / "aligned.csv"
    path.write_text("id,lower,upper,size,alignment\na,0,2,1,4\nb,1,3,1,4\n")
    assert cli_main.main(["plan", str(path), "--capacity", "4", "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["impossible"] and summary["lower_bound"] == 2


def test_not_proven_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    # naive does not search: a miss is not a proof.
    argv = ["plan", str(DATA / "pisarchyk_lee.csv"), "--planner", "naive", "--capacity", "200"]
    assert cli_main.main(argv) == 1
    assert "not proven impossible" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# tensorarena validate
# ---------------------------------------------------------------------------------------------


def _solution(tmp_path: Path, offsets: dict[str, int]) -> Path:
    problem = read_problem(TOY)
    rows = ["id,lower,upper,size,offset"] + [
        f"{b.id},{b.start},{b.end},{b.nbytes},{offsets[b.id]}" for b in problem.buffers
    ]
    path = tmp_path / "solution.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


GOOD = {"b1": 8, "b2": 8, "b3": 4, "b4": 4, "b5": 0}


def test_validate_a_valid_solution_exits_0(capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    path = _solution(tmp_path, GOOD)
    assert cli_main.main(["validate", str(TOY), str(path)]) == 0
    assert "valid: 5 buffers, height 12" in capsys.readouterr().out
    assert cli_main.main(["validate", str(TOY), str(path), "--json", "--capacity", "12"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"valid": True, "height": 12, "lower_bound": 12, "buffers": 5,
                      "error": None}


def test_validate_names_the_first_conflict_and_exits_1(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    path = _solution(tmp_path, {**GOOD, "b2": 4})  # b2 and b3 share bytes 4-7 at times 3-8
    assert cli_main.main(["validate", str(TOY), str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("INVALID") and "'b2'" in out and "'b3'" in out
    assert cli_main.main(["validate", str(TOY), str(_solution(tmp_path, GOOD)),
                          "--capacity", "11"]) == 1
    assert "past the capacity 11" in capsys.readouterr().out


def test_validate_malformed_input_exits_2(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    assert cli_main.main(["validate", str(TOY), str(tmp_path / "absent.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli_main.main(["validate", str(TOY), str(TOY)]) == 2  # no offset column
    assert "has no offset" in capsys.readouterr().err
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("id,lower,upper,size,offset\nzz,0,1,4,0\n")
    assert cli_main.main(["validate", str(TOY), str(wrong)]) == 2
    assert "does not match the problem" in capsys.readouterr().err
    assert cli_main.main(["validate", "-", "-"]) == 2


def test_validate_reads_the_solution_from_stdin(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(_solution(tmp_path, GOOD).read_text()))
    assert cli_main.main(["validate", str(TOY), "-"]) == 0
    assert capsys.readouterr().out.startswith("valid")


@pytest.mark.parametrize("garbage", ["garbage\x00\xff\n", "", "id,lower,upper,size\na,0,x,8\n"])
def test_garbage_on_stdin_is_one_error_line_that_names_stdin_once(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, garbage: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(garbage))
    assert cli_main.main(["plan", "-", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    # It read "tensorarena plan: error: -: line 1: <stdin>: ...".
    assert line.startswith("tensorarena plan: error: ") and "error: -:" not in line
    assert line.count("<stdin>") == 1


def test_json_with_offsets_and_sizes_gives_each_buffer_its_place(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plan", str(TOY), "--json", "--offsets", "--sizes"]) == 0
    summary = json.loads(capsys.readouterr().out)
    problem = read_problem(TOY)
    assert summary["sizes"] == {b.id: b.nbytes for b in problem.buffers}
    places = {b: (summary["offsets"][b], summary["offsets"][b] + n)
              for b, n in summary["sizes"].items()}
    assert max(end for _, end in places.values()) == summary["height"]  # the plan's top
    assert cli_main.main(["plan", str(TOY), "--json"]) == 0
    assert "sizes" not in json.loads(capsys.readouterr().out)  # only when asked


@pytest.mark.parametrize("flag", ["--offsets", "--sizes"])
def test_a_json_addition_without_json_is_refused(flag: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plan", str(TOY), flag]) == 2
    captured = capsys.readouterr()
    assert flag in captured.err and "--json" in captured.err and captured.out == ""


def test_offsets_without_json_is_refused_not_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plan", str(TOY), "--offsets"]) == 2  # was 0, and no offset shown
    captured = capsys.readouterr()
    assert "--offsets" in captured.err and "--json" in captured.err and captured.out == ""


def test_validate_says_which_file_a_bad_line_is_in(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    bad_problem = tmp_path / "bad_problem.csv"
    bad_problem.write_text("id,lower,upper,size\na,0,x,4\n")
    good = _solution(tmp_path, GOOD)
    assert cli_main.main(["validate", str(bad_problem), str(good)]) == 2
    assert f"problem {bad_problem}: line 2, column 'upper'" in capsys.readouterr().err
    # The same bad line in a solution on stdin: it read 'line 2, column 'upper'' alone.
    monkeypatch.setattr(sys, "stdin", io.StringIO("id,lower,upper,size,offset\na,0,x,4,0\n"))
    assert cli_main.main(["validate", str(TOY), "-"]) == 2
    assert "solution <stdin>: line 2, column 'upper'" in capsys.readouterr().err
