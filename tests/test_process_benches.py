"""Issue 22's process-memory probes (``bench/process_floor.py``, ``bench/gemm_buffers.py``): the
plain logic, and the GEMM replay against MKL's own log where torch is built with MKL."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).parent.parent / "bench"
LINE = ("MKL_VERBOSE SGEMM(T,N,50257,128,768,0x7ffc,0x7f8b,768,0x55ae,768,0x7ffd,0x55af,50257) "
        "22.72ms CNR:OFF Dyn:0 FastMM:1 TID:0  NThr:1")


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


def _script(name: str) -> ModuleType:
    return importlib.import_module(name)


def _mkl() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.backends.mkl.is_available())


def test_an_sgemm_line_gives_transposes_sizes_and_leading_dimensions() -> None:
    gemm_line = _script("gemm_buffers").gemm_line
    assert gemm_line(LINE) == "T N 50257 128 768 768 768 50257"
    assert gemm_line("MKL_VERBOSE oneMKL 2024.0 Update 2 Product build") is None
    assert gemm_line("MKL_VERBOSE DGEMM(N,N,2,2,2)") is None


def _stage(mmap: int, in_use: int, file: int) -> dict[str, int]:
    return {"mmap": mmap, "in_use": in_use, "RssFile": file}


def test_the_floor_counts_a_kernel_buffer_in_the_heap_as_in_an_mmap_block() -> None:
    kept = _script("process_floor").kept_by_kernels
    base = _stage(100, 50, 1000)
    mapped = {"stages": [base, _stage(100 + 7, 50 + 1, 1000 + 3), _stage(0, 0, 0)]}
    in_heap = {"stages": [base, _stage(100 + 2, 50 + 6, 1000 + 3), _stage(0, 0, 0)]}
    assert kept(mapped) == kept(in_heap) == 11
    # the stage after ``del`` (the last) is not the one read
    assert kept({"stages": [base, _stage(100, 50, 1000), _stage(9, 9, 9)]}) == 0


def test_a_second_build_leaves_the_first_programs_figures_alone() -> None:
    floor = _script("process_floor")

    def row(stage: str, rss: int, peak: int | None = None, mmap: int = 0) -> dict[str, object]:
        return {"stage": stage, "VmRSS": rss, **_stage(mmap, 0, 0),
                **({} if peak is None else {"peak": peak})}

    result = {"stages": [row("baseline", 100), row("built", 110), row("call 1", 150, 170),
                         row("call 2", 150, 160, mmap=5), row("del + empty_cache", 120),
                         row("built again", 125), row("call 1 again", 150, 190, mmap=9),
                         row("del + empty_cache again", 121)]}
    assert floor._peak(result) == 60 and floor._peak(result, first=True) == 70
    assert floor.kept_by_kernels(result) == 5  # the first program's last call
    assert floor._first_del(result) == 120


@pytest.mark.parametrize(("seq", "expected"), [(None, None), (128, "128"), (1, "1")])
def test_the_child_is_given_a_sequence_length_only_where_one_was_asked(
        seq: int | None, expected: str | None) -> None:
    floor = _script("process_floor")
    options = argparse.Namespace(model="resnet", batch=2, seq=seq, calls=3, rebuilds=1)
    command = floor.child_command("planned", options)
    assert command[command.index("--batch") + 1] == "2"
    assert (command[command.index("--seq") + 1] if "--seq" in command else None) == expected


@pytest.mark.parametrize("line", [
    "N N 2304 128 768 2304 768 2304",   # both operands contiguous
    "T N 128 32 64 2304 2304 128",      # a transposed operand, leading dimension > m
    "N N 64 32 128 2304 128 64",        # lda > m: a column slice
    "N T 96 40 24 96 40 96",            # the other operand transposed
])
def test_the_replay_calls_mkl_with_the_logged_arguments(line: str) -> None:
    if not _mkl():
        pytest.skip("torch without MKL")
    gb = _script("gemm_buffers")
    assert gb.mkl_gemms(lambda: gb.run_gemm(line)) == [line]


def test_seeding_mkl_with_its_largest_buffer_keeps_one() -> None:
    if not _mkl():
        pytest.skip("torch without MKL")
    # two GEMMs whose packing buffers differ in size (MKL 2024.2: 1.98 and 2.57 MB), smaller first
    held = _script("gemm_buffers").replay(["N N 2304 128 768 2304 768 2304",
                                           "N N 3072 128 768 3072 768 3072"])
    assert held["program order"]["mkl_buffers"] == 2
    assert held["largest first"]["mkl_buffers"] == 1
    assert held["seeded"]["mkl_buffers"] == 1
    assert held["largest first"]["mkl_bytes"] < held["program order"]["mkl_bytes"]


@pytest.mark.parametrize("savings", [(), ("compile-here",), ("eager-fx",),
                                     ("compile-here", "eager-fx")])
def test_each_build_peaks_variant_turns_off_what_it_names_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch, savings: tuple[str, ...]) -> None:
    pytest.importorskip("torch")
    import contextlib
    import sys

    from tensorarena.runtime import export_wire, source_compile

    shipped_from, shipped_lazy = source_compile.ELSEWHERE_FROM, export_wire.lazy_graph_modules
    monkeypatch.setattr(source_compile, "ELSEWHERE_FROM", shipped_from)  # put back after
    monkeypatch.setattr(export_wire, "lazy_graph_modules", shipped_lazy)
    _script("build_peaks").turn_off(savings)
    assert (sys.maxsize == source_compile.ELSEWHERE_FROM) == ("compile-here" in savings)
    assert (export_wire.lazy_graph_modules is shipped_lazy) == ("eager-fx" not in savings)
    if "eager-fx" in savings:
        assert isinstance(export_wire.lazy_graph_modules(None), contextlib.nullcontext)


def test_build_peaks_names_every_variant_and_gives_a_sequence_only_where_asked() -> None:
    peaks = _script("build_peaks")
    assert {execution for execution, _ in peaks.VARIANTS.values()} == {"eager", "planned"}
    for seq, expected in ((None, None), (256, "256")):
        for training in (False, True):
            options = argparse.Namespace(model="llama", batch=1, seq=seq, calls=4,
                                         training=training)
            command = peaks.child_command("planned, both", options)
            assert ("--training" in command) == training
        assert command[command.index("--child") + 1] == "planned, both"
        assert (command[command.index("--seq") + 1] if "--seq" in command else None) == expected
