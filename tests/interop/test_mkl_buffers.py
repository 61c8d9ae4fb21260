"""MKL's packing buffers made one (:mod:`tensorarena.interop.mkl_buffers`): on this torch's
MKL, against its own counts."""

from __future__ import annotations

import ctypes
import sys
import threading

import pytest

from tensorarena.interop import mkl_buffers
from tensorarena.interop.mkl_buffers import MklBuffers, consolidate, held
from tensorarena.interop.other_threads import other_threads

torch = pytest.importorskip("torch")
needs_mkl = pytest.mark.skipif(held() is None, reason="torch's MKL is not reachable")

#: (rows, k, cols) of ``torch.mm(zeros(rows, k), zeros(k, cols))``; MKL packs the second in a
#: larger buffer than the first, so the first then the second leaves two (the sizes depend on MKL)
SMALL, LARGE = (128, 768, 2304), (128, 768, 3072)


def _mm(shape: tuple[int, int, int]) -> None:
    rows, k, cols = shape
    torch.mm(torch.zeros(rows, k), torch.zeros(k, cols))


@pytest.fixture(autouse=True)
def _one_thread_fresh_cache() -> object:
    others = [t.name for t in other_threads()]
    if others:  # consolidate() leaves MKL alone while they run (tested below)
        pytest.skip(f"earlier tests left Python threads running: {others}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lib = mkl_buffers._service()
    if lib is not None:
        lib.mkl_serv_free_buffers()
    yield
    torch.set_num_threads(threads)


@needs_mkl
def test_two_buffers_become_the_larger_one_and_it_serves_both_calls() -> None:
    _mm(SMALL)
    alone = held()
    _mm(LARGE)
    both = held()
    assert alone is not None and both is not None and both.buffers == 2
    one = consolidate()
    assert one is not None and one.buffers == 1
    larger = both.bytes - alone.bytes
    assert larger <= one.bytes < both.bytes
    _mm(SMALL)
    _mm(LARGE)
    assert held() == one  # the kept buffer serves both: MKL takes no other


@needs_mkl
def test_one_buffer_is_left_as_it_is() -> None:
    _mm(LARGE)
    _mm(SMALL)  # served by the larger buffer cached already
    before = held()
    assert before is not None and before.buffers == 1
    assert consolidate() == before


@needs_mkl
def test_nothing_held_is_left_as_it_is() -> None:
    assert held() == MklBuffers(0, 0)
    assert consolidate() == MklBuffers(0, 0)


@needs_mkl
def test_a_buffer_in_use_stops_it_and_is_not_freed() -> None:
    _mm(SMALL)
    _mm(LARGE)
    lib = mkl_buffers._service()
    in_use = lib.mkl_serv_allocate(1, mkl_buffers.ALIGNMENT)  # takes the smaller free buffer
    try:
        before = held()
        assert before is not None and before.buffers == 2
        assert consolidate() == before  # one free buffer cannot be told apart: left alone
    finally:
        lib.mkl_serv_deallocate(in_use)
    assert held() == before


def test_without_mkl_it_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mkl_buffers, "_SERVICE", [None])
    assert held() is None
    assert consolidate() is None


class _TwoProjections(torch.nn.Module):
    """Two GEMMs whose packing buffers MKL sizes differently, the smaller first."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(SMALL[1], SMALL[2]) / 30)
        self.w2 = torch.nn.Parameter(torch.randn(LARGE[1], LARGE[2]) / 30)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.mm(x, self.w1).relu(), torch.mm(x, self.w2).relu()


@needs_mkl
@pytest.mark.parametrize("on", [True, False])
def test_a_program_leaves_one_buffer_after_its_first_call_and_the_same_outputs(on: bool) -> None:
    from tensorarena.runtime import PlannedProgram

    model = _TwoProjections().eval()
    x = torch.randn(SMALL[0], SMALL[1])
    program = PlannedProgram.from_module(model, (x,), isolate_export=False, mkl_buffers=on)
    first = program(x)
    assert held().buffers == (1 if on else 2)
    again = program(x)
    assert held().buffers == (1 if on else 2)  # the one kept serves both GEMMs
    with torch.no_grad():
        eager = model(x)
    for outputs in (first, again):
        for got, want in zip(outputs, eager, strict=True):
            assert torch.equal(got, want)


def test_the_option_takes_a_bool_only() -> None:
    from tensorarena.errors import InvalidArgumentError
    from tensorarena.runtime.options import ProgramOptions

    for value in ("yes", 1, None):
        with pytest.raises(InvalidArgumentError, match="mkl_buffers must be True or False"):
            ProgramOptions(mkl_buffers=value)
    assert ProgramOptions().mkl_buffers is True


@needs_mkl
def test_with_two_intra_op_threads_it_leaves_them() -> None:
    _mm(SMALL)
    _mm(LARGE)
    before = held()
    assert before is not None and before.buffers >= 2
    torch.set_num_threads(2)  # the fixture sets it back
    assert consolidate() == before
    assert held() == before


@needs_mkl
def test_while_another_python_thread_runs_it_leaves_them() -> None:
    _mm(SMALL)
    _mm(LARGE)
    before = held()
    assert before is not None and before.buffers >= 2
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert consolidate() == before
        assert held() == before
    finally:
        release.set()
        other.join()
    assert consolidate() is not None and held() != before  # alone again: it consolidates


@needs_mkl
def test_release_gives_every_free_buffer_back_and_the_next_gemm_takes_one_again() -> None:
    _mm(SMALL)
    _mm(LARGE)
    assert held() is not None and held().buffers == 2
    assert mkl_buffers.release() == MklBuffers(0, 0)
    _mm(LARGE)
    assert held() is not None and held().buffers == 1


@needs_mkl
def test_release_never_frees_a_buffer_in_use() -> None:
    _mm(SMALL)
    _mm(LARGE)
    lib = mkl_buffers._service()
    in_use = lib.mkl_serv_allocate(1, mkl_buffers.ALIGNMENT)  # takes the smaller free buffer
    try:
        after = mkl_buffers.release()
        assert after is not None and after.buffers == 1 and after.bytes > 0  # the one in use
        ctypes.memset(in_use, 7, 1)  # still the caller's
    finally:
        lib.mkl_serv_deallocate(in_use)
    assert mkl_buffers.release() == MklBuffers(0, 0)


@needs_mkl
def test_release_leaves_them_with_two_intra_op_threads_or_another_python_thread() -> None:
    _mm(SMALL)
    _mm(LARGE)
    before = held()
    torch.set_num_threads(2)  # the fixture sets it back
    assert mkl_buffers.release() == before
    torch.set_num_threads(1)
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:
        assert mkl_buffers.release() == before
    finally:
        done.set()
        other.join()
    assert mkl_buffers.release() == MklBuffers(0, 0)


def test_release_says_none_without_mkl_or_before_torch_is_imported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    assert mkl_buffers.release() is None  # and torch was not imported for it
    assert "torch" not in sys.modules
    monkeypatch.undo()
    monkeypatch.setattr(mkl_buffers, "_SERVICE", [None])
    assert mkl_buffers.release() is None


@needs_mkl
def test_empty_cache_gives_back_what_a_deleted_program_and_eager_left_in_mkl() -> None:
    import tensorarena as ta
    from tensorarena.runtime import PlannedProgram

    model = _TwoProjections().eval()
    x = torch.randn(SMALL[0], SMALL[1])
    program = PlannedProgram.from_module(model, (x,), isolate_export=False)
    outputs = program(x)
    with torch.no_grad():
        model(x)
    assert held() is not None and held().bytes > 0
    del program, outputs
    ta.empty_cache()
    assert held() == MklBuffers(0, 0)
