"""minimalloc CSV reading and writing: columns by name, legacy headers, faults with line/column."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tensorarena.errors import InvalidArgumentError, InvalidProblemError, InvalidSizeError
from tensorarena.planning.csv_io import (
    capacity_from_name,
    read_problem,
    read_solution,
    write_problem,
    write_solution,
)
from tensorarena.planning.problem import Buffer, Plan, Problem
from tensorarena.planning.validate import validate

DATA = Path(__file__).parent / "data"


def test_reads_minimal_columns_from_path() -> None:
    problem = read_problem(DATA / "toy.12.csv")
    assert problem.name == "toy.12"
    assert [b.id for b in problem.buffers] == ["b1", "b2", "b3", "b4", "b5"]
    assert problem.buffers[0] == Buffer("b1", 0, 3, 4)
    assert problem.lower_bound() == 12
    assert problem.capacity is None


def test_reads_text_and_stream_and_columns_in_any_order() -> None:
    text = "size,upper,id,lower\n8,5,a,1\n\n4,9,b,5\n"
    for source in (text, io.StringIO(text)):
        problem = read_problem(source, capacity=16)
        assert problem.buffers == (Buffer("a", 1, 5, 8), Buffer("b", 5, 9, 4))
        assert problem.capacity == 16


def test_legacy_headers_and_inclusive_end() -> None:
    problem = read_problem(DATA / "legacy_end.csv")
    assert problem.buffers == (
        Buffer("x", 0, 3, 10, 8),
        Buffer("y", 3, 4, 6, 1),  # end 3 inclusive is [3, 4)
        Buffer("z", 1, 5, 5, 4),
    )


def test_begin_and_buffer_aliases() -> None:
    problem = read_problem("buffer,begin,upper,size\nq,2,4,1\n")
    assert problem.buffers == (Buffer("q", 2, 4, 1),)


def test_capacity_from_name() -> None:
    assert capacity_from_name("A.1048576.csv") == 1048576
    assert capacity_from_name(DATA / "toy.12.csv") == 12
    assert capacity_from_name("plain.csv") is None


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("id,lower,size\na,0,1\n", 1, "upper", "missing column"),
        ("id,lower,upper,size\na,0,x,1\n", 2, "upper", "not an integer"),
        ("id,lower,upper,size\na,0,2,1\nb,0,2,1.5\n", 3, "size", "not an integer"),
        ("id,lower,upper,size\na,0,2,-1\n", 2, "size", "negative size"),
        ("id,lower,upper,size\na,0,2,1\nb,5,5,1\n", 3, "upper", "empty"),
        ("id,start,end,size\na,5,3,1\n", 2, "end", "empty"),
        ("id,lower,upper,size\na,0,2,1\n\na,1,3,1\n", 4, "id", "duplicate"),
        ("id,lower,upper,size\na,0,2\n", 2, None, "fields"),
        ("id,lower,upper,size,alignment\na,0,2,1,3\n", 2, "alignment", "power of two"),
        ("id,lower,upper,size,gaps\na,0,9,1,2-4\n", 2, "gaps", "not supported"),
        ("id,lower,upper,size\na,0,1_0,1\n", 2, "upper", "not an integer"),
        ("id,lower,upper,size\na,0,2,1\nb,0,2,١٢\n", 3, "size", "not an integer"),
        ("id,lower,upper,size\na,0,２,1\n", 2, "upper", "not an integer"),
        ("\n", 1, None, "empty"),
    ],
)
def test_malformed_csv_names_line_and_column(
    text: str, line: int, column: str | None, words: str
) -> None:
    with pytest.raises(InvalidProblemError) as info:
        read_problem(io.StringIO(text))
    assert info.value.line == line
    assert info.value.column == column
    assert words in str(info.value)
    assert f"line {line}" in str(info.value)


def test_unreadable_path_is_an_invalid_problem(tmp_path: Path) -> None:
    with pytest.raises(InvalidProblemError, match="cannot read"):
        read_problem(tmp_path / "absent.csv")
    with pytest.raises(InvalidProblemError, match="cannot read"):
        read_problem(tmp_path)  # a folder


def _rows(n: int) -> list[bytes]:
    return [b"id,lower,upper,size\n"] + [f"b{i},0,2,1\n".encode() for i in range(2, n + 1)]


def test_invalid_utf8_names_its_own_line(tmp_path: Path) -> None:
    # A text stream decodes thousands of lines at once, so a decoding error used to land on the
    # line where that block began (line 1 for any small file).
    rows = _rows(60)
    rows[39] = b"b40,0,2,\xff1\n"  # line 40
    path = tmp_path / "bad.csv"
    path.write_bytes(b"".join(rows))
    with pytest.raises(InvalidProblemError) as info:
        read_problem(path)
    assert info.value.line == 40
    assert "line 40" in str(info.value) and "UTF-8" in str(info.value)


def test_line_endings_of_every_kind(tmp_path: Path) -> None:
    for ending in (b"\n", b"\r\n", b"\r"):
        path = tmp_path / "endings.csv"
        path.write_bytes(ending.join([b"id,lower,upper,size", b"a,0,2,1", b"b,1,3,2", b""]))
        assert read_problem(path).buffers == (Buffer("a", 0, 2, 1), Buffer("b", 1, 3, 2))
    path.write_bytes(b"\xef\xbb\xbfid,lower,upper,size\na,0,2,1\n")  # a byte-order mark
    assert read_problem(path).buffers == (Buffer("a", 0, 2, 1),)


def test_a_number_with_thousands_of_digits_is_a_problem_error_with_its_line() -> None:
    text = "id,lower,upper,size\na,0,2,1\nb,0,2," + "9" * 5000 + "\n"
    with pytest.raises(InvalidProblemError) as info:
        read_problem(text)
    assert (info.value.line, info.value.column) == (3, "size")
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("source", [None, 42, b"id,lower,upper,size\n", ["id,lower"]])
def test_a_source_that_is_no_path_text_or_stream(source: object) -> None:
    with pytest.raises(InvalidArgumentError, match="path, CSV text or an open text stream"):
        read_problem(source)  # type: ignore[arg-type]


def test_capacity_is_a_size_like_any_other() -> None:
    assert read_problem(DATA / "toy.12.csv", capacity="1KiB").capacity == 1024
    with pytest.raises(InvalidSizeError, match="capacity"):
        read_problem(DATA / "toy.12.csv", capacity=-1)


def test_other_entry_points_refuse_wrong_types(tmp_path: Path) -> None:
    problem = read_problem(DATA / "toy.12.csv")
    with pytest.raises(InvalidArgumentError, match="expected a path"):
        capacity_from_name(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="expected a Problem"):
        write_problem("abc", tmp_path / "p.csv")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="expected a Plan"):
        write_solution(problem, tmp_path / "s.csv")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="a target must be a path"):
        write_problem(problem, None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="expected a Problem"):
        read_solution(DATA / "solution.csv", "toy")  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_problem_round_trip_keeps_alignment(tmp_path: Path) -> None:
    problem = Problem(
        [Buffer("a,1", 0, 4, 10, 8), Buffer("b", 2, 6, 3), Buffer("c", 5, 7, 0, 64)]
    )
    path = tmp_path / "p.csv"
    write_problem(problem, path)
    assert path.read_text().splitlines()[0] == "id,lower,upper,size,alignment"
    assert read_problem(path).buffers == problem.buffers
    plain = Problem([Buffer("a", 0, 1, 1)])
    out = io.StringIO()
    write_problem(plain, out)
    assert out.getvalue() == "id,lower,upper,size\na,0,1,1\n"


def test_solution_round_trip(tmp_path: Path) -> None:
    problem = read_problem(DATA / "toy.12.csv")
    plan = Plan(problem, (8, 8, 4, 4, 0), planner="hand")
    validate(problem, plan)
    path = tmp_path / "s.csv"
    write_solution(plan, path)
    again = read_solution(path, problem)
    assert again.offsets == plan.offsets
    assert again.problem is problem
    alone = read_solution(path)
    assert alone.problem.buffers == problem.buffers
    assert alone.offsets == plan.offsets


def test_read_solution_matches_ids_in_any_order() -> None:
    problem = read_problem(DATA / "toy.12.csv")
    shuffled = "id,lower,upper,size,offset\n" + "\n".join(
        reversed((DATA / "solution.csv").read_text().splitlines()[1:])
    )
    plan = read_solution(shuffled, problem)
    assert plan.as_dict() == {"b1": 8, "b2": 8, "b3": 4, "b4": 4, "b5": 0}
    validate(problem, plan)


def test_read_solution_refuses_mismatch() -> None:
    problem = read_problem(DATA / "toy.12.csv")
    with pytest.raises(InvalidProblemError, match="offset"):
        read_solution(DATA / "toy.12.csv", problem)
    with pytest.raises(InvalidProblemError, match="missing ids"):
        read_solution("id,lower,upper,size,offset\nb1,0,3,4,0\n", problem)
    with pytest.raises(InvalidProblemError, match="differs"):
        read_solution(
            (DATA / "solution.csv").read_text().replace("b1,0,3,4", "b1,0,3,5"), problem
        )
