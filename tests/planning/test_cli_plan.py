"""The ``tensorarena plan`` contract: one JSON object, exit codes 0/1/2, messages on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from instances import BUDGETED

import tensorarena.cli.main as cli_main
from tensorarena.planning.csv_io import read_problem, read_solution, write_problem
from tensorarena.planning.exact_sections import build_sections
from tensorarena.planning.exact_work import node_work
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"
KEYS = {"buffers", "lower_bound", "height", "ratio", "optimal", "feasible", "planner", "seconds",
        "validate_seconds", "bound", "impossible", "stopped_by", "nodes", "node_limit",
        "work", "work_limit", "time_limit"}


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


def test_json_says_what_ended_the_search_and_what_it_used(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "aligned.csv"
    write_problem(BUDGETED, path)  # optimum 37, proven in 3236 nodes
    status, cut = run_json(capsys, str(path), "--gap", "0", "--node-limit", "100")
    assert status == 0
    assert (cut["stopped_by"], cut["nodes"], cut["node_limit"]) == ("budget", 100, 100)
    assert cut["optimal"] is False
    status, full = run_json(capsys, str(path), "--gap", "0", "--node-limit", "none",
                            "--time-limit", "inf")
    assert (full["stopped_by"], full["optimal"]) == ("proven", True)
    assert int(full["nodes"]) > 100  # type: ignore[call-overload]
    assert full["node_limit"] is None and full["time_limit"] is None
    status, late = run_json(capsys, str(path), "--gap", "0", "--time-limit", "0")
    assert late["stopped_by"] == "time_limit" and late["time_limit"] == 0.0


def test_json_says_when_the_work_budget_ended_the_search(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "aligned.csv"
    write_problem(BUDGETED, path)
    unit = node_work(build_sections(BUDGETED.buffers))
    status, cut = run_json(capsys, str(path), "--gap", "0", "--work-limit", str(100 * unit))
    assert status == 0
    assert (cut["stopped_by"], cut["nodes"], cut["node_limit"]) == ("budget", 100, 250_000)
    assert (cut["work"], cut["work_limit"]) == (100 * unit, 100 * unit)
    status, full = run_json(capsys, str(path), "--gap", "0", "--work-limit", "none")
    assert full["stopped_by"] == "proven" and full["work_limit"] is None
    assert full["work"] == unit * int(full["nodes"])  # type: ignore[call-overload]
    assert cli_main.main(["plan", str(path), "--work-limit", "-1"]) == 2
    assert "--work-limit must be a non-negative number of work units" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["-3", "1.5", "lots"])
def test_a_bad_node_limit_exits_2(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    assert cli_main.main(["plan", str(DATA / "toy.12.csv"), f"--node-limit={bad}"]) == 2
    assert "--node-limit" in capsys.readouterr().err


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


def test_help_states_the_size_rule_and_the_data_folder(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main.main(["plan", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "kB/MB/GB/TB powers of 1000" in text and "1MB is 1000000 bytes" in text
    assert "Exit status: 0" in text
    with pytest.raises(SystemExit):
        cli_main.main(["bench", "plan", "--help"])
    assert "TENSORARENA_DATA" in capsys.readouterr().out


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
    pytest.importorskip("rich")  # an optional dependency: without it, no progress at all
    argv = ["plan", str(DATA / "toy.12.csv"), "--json"]
    assert cli_main.main(argv) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""  # not a terminal: nothing
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli_main.main(argv) == 0
    shown = capsys.readouterr()
    assert "planning 5 buffers with auto" in shown.err
    assert "\x1b" not in shown.out  # the terminal codes went to stderr, none to stdout
    assert json.loads(shown.out)["height"] == json.loads(quiet.out)["height"] == 12


def test_quiet_or_without_rich_progress_is_plain_or_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["plan", str(DATA / "toy.12.csv"), "--json"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli_main.main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setitem(sys.modules, "rich", None)  # rich not installed: plain text
    monkeypatch.setitem(sys.modules, "rich.console", None)
    assert cli_main.main(argv) == 0
    err = capsys.readouterr().err
    assert "planning 5 buffers with auto: best 12 vs bound 12" in err
    assert err.endswith("\r\x1b[K")  # the line is cleared before the result is printed


def test_gap_and_minimize_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "above.csv"  # portfolio 15, optimum 14, lower bound 12
    path.write_text("id,lower,upper,size,alignment\na,4,6,3,4\nb,4,7,3,4\nc,5,7,6,4\n"
                    "d,2,4,4,1\n")
    status, summary = run_json(capsys, str(path), "--capacity", "100")
    assert status == 0 and summary["height"] == 15  # it fits: done
    status, summary = run_json(capsys, str(path), "--capacity", "100", "--minimize")
    assert status == 0 and summary["height"] == 14 and summary["optimal"]
    assert summary["bound"] == 14
    status, summary = run_json(capsys, str(path), "--gap", "0.5")
    assert status == 0 and summary["height"] == 15 and not summary["optimal"]
    assert cli_main.main(["plan", str(path), "--gap", "-1"]) == 2
    assert "--gap" in capsys.readouterr().err
    assert cli_main.main(["plan", str(path), "--minimize"]) == 2  # used to be ignored
    assert "--minimize lowers a plan after it fits --capacity" in capsys.readouterr().err


def _slip_problem(path: Path, lower_bound: int) -> str:
    """A problem whose lower bound is ``lower_bound`` (two buffers live at once)."""
    half = lower_bound // 2
    path.write_text(f"id,lower,upper,size\na,0,2,{half}\nb,1,3,{lower_bound - half}\n")
    return str(path)


@pytest.mark.parametrize(
    ("name", "bound", "capacity", "hint"),
    [
        ("A.1048576.csv", 1_000_200, "1MB", "the file name says 1048576"),
        ("plain.csv", 1_040_000, "1MB", "lower bound, 1040000 bytes, fits in 1MiB"),
        ("B.2097152.csv", 2_000_200, "2 mb", "the file name says 2097152"),
        ("plain.csv", 1_100_000, "1MB", ""),  # over 1 MiB too: no slip, just too small
        ("plain.csv", 1_040_000, "1000000", ""),  # no unit: nothing to mistake
        ("plain.csv", 1_040_000, "0.001MB", ""),  # 1000 bytes; 0.001 MiB is not whole bytes
    ],
)
def test_a_capacity_that_looks_like_a_unit_slip_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, bound: int, capacity: str,
    hint: str,
) -> None:
    path = _slip_problem(tmp_path / name, bound)
    status = cli_main.main(["plan", path, "--capacity", capacity, "--planner", "portfolio",
                            "--json"])
    out, err = capsys.readouterr()
    assert status == 1 and json.loads(out)["feasible"] is False  # the exit code contract holds
    if hint:
        binary = capacity.strip()[0] + "MiB"
        assert f"did you mean {binary}" in err and hint in err
    else:
        assert "did you mean" not in err


def test_the_same_capacity_in_binary_units_fits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _slip_problem(tmp_path / "A.1048576.csv", 1_000_200)
    assert cli_main.main(["plan", path, "--capacity", "1MiB", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["feasible"] is True and err == ""


def test_invalid_utf8_is_reported_on_its_own_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = [b"id,lower,upper,size\n"] + [f"b{i},0,2,1\n".encode() for i in range(2, 61)]
    rows[39] = b"b40,0,2,1\xe9\n"  # Latin-1 in a UTF-8 file, on line 40
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"".join(rows))
    assert cli_main.main(["plan", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "line 40" in captured.err and "UTF-8" in captured.err


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--capacity", "-5"], "--capacity must be non-negative"),
        (["--capacity", "9" * 5000], "--capacity"),
        (["--alignment", "0"], "--alignment"),
        (["--time-limit", "nan"], "--time-limit must be a non-negative number"),
        (["--time-limit", "-1"], "--time-limit must be a non-negative number"),
    ],
)
def test_bad_options_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    assert cli_main.main(["plan", str(DATA / "toy.12.csv"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensorarena plan: error: ") and err.count("\n") == 1
    assert words in err and "does not parse" not in err


def test_bad_files_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    huge = tmp_path / "huge.csv"
    huge.write_text("id,lower,upper,size\na,0,2," + "9" * 5000 + "\n")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    text_like = tmp_path / "id,lower,upper,size\na,0,2,4"  # a file name that looks like CSV
    for path, words in ((tmp_path, "cannot read"), (huge, "line 2, column 'size'"),
                        (binary, "UTF-8"), (text_like, "cannot read")):
        assert cli_main.main(["plan", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert err.startswith("tensorarena plan: error: ") and words in err, err
    out = tmp_path / "no such folder" / "s.csv"
    assert cli_main.main(["plan", str(DATA / "toy.12.csv"), "--out", str(out)]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_an_infinite_time_limit_is_no_limit(capsys: pytest.CaptureFixture[str]) -> None:
    status, summary = run_json(capsys, str(DATA / "pisarchyk_lee.csv"), "--time-limit", "inf")
    assert status == 0 and summary["height"] == 124


def test_human_summary_reports_the_search(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    path = tmp_path / "tight.csv"
    path.write_text("id,lower,upper,size\na,1,3,3\nb,1,4,2\nc,3,6,1\nd,4,5,3\n")
    assert cli_main.main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "height       5 (5 B), 1.0000 x lower bound, optimal" in out
    nodes = next(line for line in out.splitlines() if line.startswith("search"))
    assert " of 250000 nodes, " in nodes
    assert nodes.endswith(" of 4500000000 work units, ended by proven")
    assert int(nodes.split()[1]) > 0


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
