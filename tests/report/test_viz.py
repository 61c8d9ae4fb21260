"""tensorarena viz: one self-contained HTML page (plotly inlined) and a PNG (matplotlib)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from _events import random_events

from tensorarena.cli.main import main
from tensorarena.report import timeline_from_events
from tensorarena.trace import Trace, write_trace


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    path = tmp_path / "workload.csv"
    write_trace(Trace.from_events(random_events(800)), path)
    return path


def test_the_page_is_self_contained_and_has_the_three_charts(tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the HTML timeline needs the viz extra (plotly)")
    from tensorarena.report.viz import render_html

    page = render_html(timeline_from_events(random_events(500), name="w<1>"))
    for element in ("timeline", "layout", "sites", "summary"):
        assert f'id="{element}"' in page or f"id='{element}'" in page
    # Nothing is fetched: no script or stylesheet comes from elsewhere.
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)
    assert page.count("Plotly.newPlot") == 3 and len(page) > 3_000_000  # the library inlined
    assert "w&lt;1&gt;" in page and "w<1>" not in page  # names are escaped


def test_cli_writes_html_and_png(trace_file: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly", reason="the HTML timeline needs the viz extra (plotly)")
    pytest.importorskip("matplotlib", reason="the PNG timeline needs the plot extra")
    out = tmp_path / "report.html"
    assert main(["viz", str(trace_file), "-o", str(out), "--png"]) == 0
    assert out.stat().st_size > 3_000_000
    picture = out.with_suffix(".png")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    pixels = imread(picture)
    assert pixels.shape[0] > 500 and pixels.std() > 0.05  # drawn, not blank
    assert "800 allocations and frees" in capsys.readouterr().out


def test_the_png_of_a_large_trace_uses_the_occupancy_map(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the PNG timeline needs the plot extra")
    from tensorarena.report.viz import write_png

    write_png(timeline_from_events(random_events(6000)), tmp_path / "big.png", max_blocks=100)
    assert (tmp_path / "big.png").stat().st_size > 10_000


def test_a_malformed_input_exits_2_with_the_line(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("op,id,size\na,0,10\na,0,10\n")
    assert main(["viz", str(bad)]) == 2
    assert "line 3" in capsys.readouterr().err
    assert main(["viz", str(tmp_path / "missing.csv")]) == 2


def test_a_missing_plotly_names_the_extra(trace_file: Path, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['plotly'] = None; "
            "from tensorarena.cli.main import main; "
            f"sys.exit(main(['viz', {str(trace_file)!r}, '-o', {str(tmp_path / 'x.html')!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "pip install 'tensorarena[viz]'" in result.stderr
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("options", [{"max_points": 0}, {"max_points": -1}, {"max_points": 2.5},
                                     {"max_blocks": -1}, {"time_samples": 1}, {"top_sites": 0},
                                     {"max_point": 100}, {"dpi": 0}], ids=repr)
def test_a_bad_view_option_is_an_invalid_argument_before_anything_is_drawn(
    options: dict[str, object], tmp_path: Path,
) -> None:
    # render_html(t, max_points=0) raised ZeroDivisionError, max_points=-1 NumPy's ValueError,
    # a misspelt option TypeError; write_png(dpi=0) matplotlib's ValueError.
    from tensorarena.errors import InvalidArgumentError
    from tensorarena.report.viz import render_html, write_png

    timeline = timeline_from_events(random_events(300))
    picture = tmp_path / "t.png"
    if "dpi" not in options:
        with pytest.raises(InvalidArgumentError):
            render_html(timeline, **options)
    with pytest.raises(InvalidArgumentError):
        write_png(timeline, picture, **options)  # type: ignore[arg-type]
    assert not picture.exists()
