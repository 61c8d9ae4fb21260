"""The ``tensorarena plan`` contract: one JSON object, exit codes 0/1/2, messages on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tensorarena.cli.main as cli_main
from tensorarena.planning.csv_io import read_problem, read_solution
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"
KEYS = {"buffers", "lower_bound", "height", "ratio", "optimal", "feasible", "planner", "seconds"}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    status = cli_main.main(["plan", *argv, "--json"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # exactly one JSON object, one line
    return status, json.loads(out)


def test_json_summary_for_an_optimal_plan(capsys: pytest.CaptureFixture[str]) -> None:
    status, summary = run_json(capsys, str(DATA / "pisarchyk_lee.csv"))
    assert status == 0
    assert set(summary) == KEYS
    assert summary["buffers"] == 8
    assert summary["lower_bound"] == 124
    assert summary["height"] == 124
    assert summary["ratio"] == 1.0
    assert summary["optimal"] is True
    assert summary["feasible"] is True
    assert str(summary["planner"]).startswith("auto")
    assert isinstance(summary["seconds"], float)


@pytest.mark.parametrize("planner", ["naive", "greedy_size", "greedy_size_first_fit",
                                     "greedy_breadth", "heap_best_fit", "portfolio"])
def test_every_heuristic_by_name(capsys: pytest.CaptureFixture[str], planner: str) -> None:
    status, summary = run_json(capsys, str(DATA / "toy.12.csv"), "--planner", planner)
    assert status == 0
    assert str(summary["planner"]).startswith(planner)
    assert summary["feasible"] is True  # no capacity asked for


def test_capacity_that_does_not_fit_exits_1_with_the_best_height(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "s.csv"
    status, summary = run_json(capsys, str(DATA / "pisarchyk_lee.csv"), "--planner", "naive",
                               "--capacity", "200", "--out", str(out))
    assert status == 1
    assert summary["feasible"] is False
    assert summary["height"] == 234
    assert not out.exists()


def test_capacity_as_size_string_and_solution_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "s.csv"
    status, summary = run_json(capsys, str(DATA / "toy.12.csv"), "--capacity", "1KiB",
                               "--alignment", "8", "--out", str(out))
    assert status == 0 and summary["feasible"] is True
    problem = read_problem(DATA / "toy.12.csv")
    plan = read_solution(out, problem)
    validate(problem.with_alignment(8), plan, capacity=1024)
    assert plan.height == summary["height"]


def test_human_summary(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli_main.main(["plan", str(DATA / "toy.12.csv"), "--capacity", "11"])
    out = capsys.readouterr().out
    assert status == 1
    assert "DOES NOT FIT" in out and "lower bound  12" in out


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("id,lower,upper,size\na,0,2,1\nb,0,2,zz\n", "line 3, column 'size'"),
        ("id,lower,upper,size\na,0,2,-4\n", "negative size"),
        ("id,lower,upper,size\na,3,3,4\n", "line 2, column 'upper'"),
        ("id,lower,size\na,0,4\n", "missing column 'upper'"),
    ],
)
def test_bad_input_exits_2_with_line_and_column(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    assert cli_main.main(["plan", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert needle in captured.err


def test_unreadable_file_and_bad_options_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli_main.main(["plan", str(tmp_path / "absent.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err
    good = str(DATA / "toy.12.csv")
    assert cli_main.main(["plan", good, "--capacity", "lots"]) == 2
    assert "--capacity" in capsys.readouterr().err
    assert cli_main.main(["plan", good, "--alignment", "12"]) == 2
    assert "power of two" in capsys.readouterr().err
    assert cli_main.main(["plan", good, "--time-limit", "-1"]) == 2
    with pytest.raises(SystemExit) as info:
        cli_main.main(["plan", good, "--planner", "nope"])
    assert info.value.code == 2


def test_subprocess_contract(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tensorarena", "plan", str(DATA / "pisarchyk_lee.csv"), "--json",
         "--capacity", "124"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["height"] == 124 and summary["feasible"] and summary["optimal"]


def test_bench_plan_json_and_skips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status = cli_main.main(["bench", "plan", "--json", "--data", str(tmp_path),
                            "--suite", "pisarchyk", "--suite", "minimalloc", "--suite",
                            "idealloc", "--quick"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    suites = report["suites"]
    rows = suites["pisarchyk"]["rows"]
    assert [r["height"] for r in rows] == [124] * len(rows)
    assert all(r["valid"] for r in rows)
    assert "minimalloc" in suites["minimalloc"]["skipped"]
    assert "idealloc" in suites["idealloc"]["skipped"]
    assert str(tmp_path) in suites["idealloc"]["skipped"]


def test_bench_plan_data_comes_from_the_option_or_the_environment_only(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without --data or TENSORARENA_DATA the data suites are skipped, saying how to give the
    # data, even when the checkout happens to sit next to a folder of benchmarks.
    monkeypatch.delenv("TENSORARENA_DATA", raising=False)
    argv = ["bench", "plan", "--json", "--quick", "--suite", "minimalloc", "--suite", "idealloc"]
    assert cli_main.main(argv) == 0
    suites = json.loads(capsys.readouterr().out)["suites"]
    for name in ("minimalloc", "idealloc"):
        assert "pass --data DIR or set TENSORARENA_DATA" in suites[name]["skipped"]
    folder = tmp_path / "minimalloc" / "challenging"
    folder.mkdir(parents=True)
    (folder / "toy.12.csv").write_text((DATA / "toy.12.csv").read_text())
    monkeypatch.setenv("TENSORARENA_DATA", str(tmp_path))
    assert cli_main.main(argv) == 0
    suites = json.loads(capsys.readouterr().out)["suites"]
    (row,) = suites["minimalloc"]["rows"]
    assert (row["instance"], row["height"], row["fits"], row["valid"]) == ("toy", 12, True, True)


def test_bench_plan_table_on_our_own_minimalloc_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "minimalloc" / "challenging"
    folder.mkdir(parents=True)
    (folder / "toy.12.csv").write_text((DATA / "toy.12.csv").read_text())
    status = cli_main.main(["bench", "plan", "--data", str(tmp_path), "--suite", "minimalloc",
                            "--time-limit", "1"])
    assert status == 0
    out = capsys.readouterr().out
    assert "minimalloc challenging" in out
    line = next(row for row in out.splitlines() if row.strip().startswith("toy"))
    assert " 12 " in line and "yes" in line


def test_progress_goes_to_a_terminal_stderr_only(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rich")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    status, summary = run_json(capsys, str(DATA / "toy.12.csv"))
    assert status == 0 and summary["height"] == 12


def test_header_only_problem_plans_to_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("id,lower,upper,size\n")
    status, summary = run_json(capsys, str(path))
    assert status == 0
    assert (summary["buffers"], summary["height"], summary["ratio"]) == (0, 0, 1.0)


def test_bench_models_suite_skips_without_the_models_module(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorarena.planning.models", None)  # import fails
    assert cli_main.main(["bench", "plan", "--json", "--suite", "models"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "real-model problems unavailable" in report["suites"]["models"]["skipped"]
