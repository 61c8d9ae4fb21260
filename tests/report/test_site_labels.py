"""Blocks are grouped and labelled by the program's line, keep their allocator and whole stack,
and the axes are in units that match the data."""

from __future__ import annotations

import numpy as np
import pytest

from tensorarena.report import timeline_from_events
from tensorarena.report.site_labels import is_library_file, site_label
from tensorarena.trace import Event

pytest.importorskip("torch", reason="a library module to tell apart from the program's")


def test_the_label_is_the_first_frame_outside_the_libraries() -> None:
    site = "torch/nn/functional.py:2100 in linear; model.py:12 in forward; main.py:3 in <module>"
    assert site_label(site, "aten::mm") == "model.py:12 in forward"
    # every frame a library's: the innermost one; no stack: the tag, then a placeholder
    assert site_label("torch/nn/functional.py:2100 in linear", "x") == \
        "torch/nn/functional.py:2100 in linear"
    assert site_label("", "aten::mm") == "aten::mm"
    assert site_label("", "") == "<no site recorded>"
    assert is_library_file("<frozen runpy>") and is_library_file(np.__file__)
    assert not is_library_file("model.py") and not is_library_file("/home/me/model.py")


def test_blocks_of_one_line_are_one_site_whatever_the_library_frames_below() -> None:
    events = [
        Event("a", 0, 64, 0, 0, "aten::mm", "torch",
              "torch/nn/functional.py:2100 in linear; model.py:12 in forward"),
        Event("a", 1, 32, 0, 1, "aten::add", "torch",
              "torch/functional.py:400 in add; model.py:12 in forward"),
        Event("a", 2, 16, 0, 2, "", "tensorarena/default", "model.py:20 in step"),
        Event("f", 0, 64, 0, 3),
    ]
    timeline = timeline_from_events(events)
    labels = [timeline.sites[i] for i in timeline.block_site]
    assert labels == ["model.py:12 in forward", "model.py:12 in forward", "model.py:20 in step"]
    assert timeline.block_allocator is not None and timeline.block_stack is not None
    assert [timeline.allocators[i] for i in timeline.block_allocator] == \
        ["torch", "torch", "tensorarena/default"]
    # the whole stack stays with each block (for the hover), one entry per distinct stack
    assert timeline.stacks[timeline.block_stack[1]].startswith("torch/functional.py:400")
    assert len(set(timeline.block_stack.tolist())) == 3


@pytest.mark.parametrize(("span_us", "title"), [(9_999, "time (µs)"), (10_000, "time (ms)"),
                                                 (10_000_000, "time (s)")])
def test_the_time_axis_unit_follows_the_trace_length(span_us: int, title: str) -> None:
    from tensorarena.report.viz import time_unit

    timeline = timeline_from_events([Event("a", 0, 8, 0, 0), Event("f", 0, 8, 0, span_us)])
    assert time_unit(timeline)[1] == title
    untimed = timeline_from_events([Event("a", 0, 8), Event("f", 0, 8)])
    assert time_unit(untimed) == (1.0, "allocation/free number")


@pytest.mark.parametrize(("nbytes", "unit"), [(2047, "B"), (2048, "KiB"), (2 << 20, "MiB"),
                                              ((2 << 30) - 1, "MiB"), (2 << 30, "GiB")])
def test_the_byte_axis_unit_follows_the_largest_value(nbytes: int, unit: str) -> None:
    from tensorarena.report.viz import byte_unit

    assert byte_unit(nbytes)[1] == unit
