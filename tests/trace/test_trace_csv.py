"""Our CSV format: the minimal form, optional columns, line-numbered errors, atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _traces import random_trace

from tensorarena.trace import (
    CsvWriter,
    Event,
    MalformedTraceError,
    iter_csv,
    iter_events,
    read_trace,
    write_csv,
)


def test_the_minimal_three_column_form_is_accepted_as_is(tmp_path: Path) -> None:
    path = tmp_path / "min.csv"
    path.write_text("op,id,size\na,0,4096\na,1,512\nf,0,4096\nf,1,\n")
    trace = read_trace(path)
    assert [tuple(e)[:3] for e in trace] == [("a", 0, 4096), ("a", 1, 512), ("f", 0, 4096),
                                             ("f", 1, 512)]
    assert trace.name == "min" and trace.metadata["format"] == "csv"


def test_optional_columns_in_any_order_comments_and_blank_lines() -> None:
    text = ("# made by hand\n\ntag,size,op,time_us,id,stream\n"
            "aten::mm,100,a,5,3,2\n# a comment between rows\n\n,100,f,,3,2\n")
    events = list(iter_csv(text))
    assert events == [Event("a", 3, 100, 2, 5, "aten::mm"), Event("f", 3, 100, 2, None, "")]


def test_write_then_read_preserves_every_field(tmp_path: Path) -> None:
    trace = random_trace(400, streams=3)
    write_csv(trace, tmp_path / "t.csv")
    assert read_trace(tmp_path / "t.csv").events == trace.events
    first = (tmp_path / "t.csv").read_text().splitlines()[:2]
    assert first == ["# tensorarena trace, version 1", "op,id,size,stream,time_us,tag"]


def test_the_writer_adds_only_the_columns_the_events_use(tmp_path: Path) -> None:
    write_csv([Event("a", 0, 8), Event("f", 0, 8)], tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().splitlines()[1:] == ["op,id,size", "a,0,8", "f,0,8"]


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("", 1, None, "empty file"),
        ("op,id\na,0\n", 1, "size", "missing column"),
        ("op,id,size,colour\n", 1, "colour", "unknown column"),
        ("op,id,size,op\n", 1, None, "twice"),
        ("op,id,size\na,0,10\nx,1,10\n", 3, "op", "neither"),
        ("op,id,size\na,zero,10\n", 2, "id", "not an integer"),
        ("op,id,size\na,0,ten\n", 2, "size", "not an integer"),
        ("op,id,size\na,0,\n", 2, "size", "not an integer"),
        ("op,id,size\na,-3,10\n", 2, "id", "negative"),
        ("op,id,size\na,0,-10\n", 2, "size", "positive"),
        ("op,id,size\na,0,10,5\n", 2, None, "4 fields"),
        ("op,id,size\na,0,10\n\nf,1,10\n", 4, "id", "not live"),
        ("op,id,size\na,0,10\nf,0,12\n", 3, "size", "allocated with 10"),
        ("op,id,size\na,0," + "9" * 50 + "\n", 2, "size", "positive byte count"),
        ("op,id,size\na,0,1" + "0" * 5000 + "\n", 2, "size", "digits"),
        ("op,id,size,stream\na,0,1,s\n", 2, "stream", "not an integer"),
        ("op,id,size,time_us\na,0,1,now\n", 2, "time_us", "not an integer"),
        ("# tensorarena trace, version 9\nop,id,size\n", 1, None, "version 9"),
        # int() takes these as numbers; a trace's numbers are ASCII digits
        ("op,id,size\na,\u0661\u0662,10\n", 2, "id", "ASCII digits"),
        ("op,id,size\na,0,\uff11\uff12\n", 2, "size", "ASCII digits"),
        ("op,id,size,time_us\na,0,1,1_000\n", 2, "time_us", "ASCII digits"),
        ("op,id,size,stream\na,0,1,0\nf,0,1,\u0967\n", 3, "stream", "ASCII digits"),
    ],
)
def test_malformed_input_names_its_line_and_column(text: str, line: int, column: str | None,
                                                   words: str) -> None:
    with pytest.raises(MalformedTraceError, match=words) as info:
        list(iter_csv(text if "\n" in text else text + "\n"))
    assert (info.value.line, info.value.column) == (line, column)
    assert f"line {line}" in str(info.value)


def test_a_bad_byte_is_reported_on_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"op,id,size\n" + b"".join(b"a,%d,10\n" % i for i in range(3000))
                     + b"a,\xff,10\n")
    with pytest.raises(MalformedTraceError, match="UTF-8") as info:
        list(iter_csv(path))
    assert info.value.line == 3002


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MalformedTraceError, match="cannot read"):
        read_trace(tmp_path / "nope.csv", format="csv")


def test_an_interrupted_write_leaves_nothing_under_the_final_name(tmp_path: Path) -> None:
    def events():  # type: ignore[no-untyped-def]
        yield Event("a", 0, 10)
        raise KeyboardInterrupt

    target = tmp_path / "t.csv"
    with pytest.raises(KeyboardInterrupt):
        write_csv(events(), target, columns=("op", "id", "size"))
    assert os.listdir(tmp_path) == []
    target.write_text("op,id,size\na,0,1\n")  # an older file of that name stays as it was
    with pytest.raises(KeyboardInterrupt):
        write_csv(events(), target, columns=("op", "id", "size"))
    assert target.read_text() == "op,id,size\na,0,1\n" and os.listdir(tmp_path) == ["t.csv"]


def test_the_streaming_writer_appears_only_when_closed(tmp_path: Path) -> None:
    target = tmp_path / "rec.csv"
    with CsvWriter(target) as writer:
        writer(Event("a", 0, 10, 1, 3, "x"))
        writer(Event("f", 0, 10, 1, 4, ""))
        assert not target.exists()
    assert [tuple(e) for e in iter_csv(target)] == [("a", 0, 10, 1, 3, "x", "", ""),
                                                    ("f", 0, 10, 1, 4, "", "", "")]
    aborted = CsvWriter(tmp_path / "gone.csv")
    aborted(Event("a", 0, 10))
    aborted.abort()
    assert sorted(os.listdir(tmp_path)) == ["rec.csv"]


@pytest.mark.parametrize("source", [5, None, b"a,1,64\n", 2.5], ids=repr)
@pytest.mark.parametrize("format", [None, "csv", "rmm"])
def test_a_source_that_is_no_path_text_or_stream_is_a_malformed_trace(
    source: object, format: str | None,
) -> None:
    # read_trace(5) raised AttributeError ('int' has no 'tell'), with a format TypeError.
    with pytest.raises(MalformedTraceError, match="path, a text or a readable stream"):
        read_trace(source, format=format)  # type: ignore[arg-type]
    with pytest.raises(MalformedTraceError, match="path, a text or a readable stream"):
        list(iter_events(source, format=format))  # type: ignore[arg-type]
