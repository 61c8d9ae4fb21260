"""A shape's first call with the kernel arena: record, plan again (runtime/kernel_recording.py).

What the first call keeps resident beside the arena: the C heap that compiling left is given
back before the call runs, MKL keeps one GEMM buffer through the call, and the call after it
gives the released tail back before it compiles the new code; with ``outputs="arena"`` no code
is compiled for the recording's block. Outputs stay bit-identical with eager's throughout.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tensorarena.interop import mkl_buffers  # noqa: E402
from tensorarena.interop.other_threads import other_threads  # noqa: E402
from tensorarena.runtime import (  # noqa: E402
    PlannedProgram,
    kernel_arena,
    kernel_recording,
    shape_code,
)
from tensorarena.runtime.kernel_state import KernelState  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def shim() -> Any:
    reason = kernel_arena.unavailable()
    if reason:
        pytest.skip(f"kernel arena shim unavailable: {reason}")
    return kernel_arena.extension()


class Block(torch.nn.Module):
    """Layer norm (allocates inside its out variant), attention (no out variant), two GEMMs
    of different sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)
        self.up = torch.nn.Linear(32, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.up(a + x).relu()


def block(**options: Any) -> tuple[PlannedProgram, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 8, 32)
    return PlannedProgram.from_module(model, (x,), **options), model, x


def counting(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """Log each code generation, C heap trim and pool trim of the shape's code, in order."""
    generate, trim_heap = shape_code.generate, kernel_recording.trim_c_heap
    trim_pools = shape_code.trim_pools

    def logged(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            events.append(name)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(shape_code, "generate", logged("generate", generate))
    monkeypatch.setattr(kernel_recording, "trim_c_heap", logged("trim heap", trim_heap))
    monkeypatch.setattr(shape_code, "trim_pools", logged("trim pools", trim_pools))


@pytest.mark.parametrize("outputs", ["handover", "fresh", "arena"])
def test_the_first_call_records_and_the_replanned_code_is_made_once_outputs_exact(
        shim: Any, monkeypatch: pytest.MonkeyPatch, outputs: str) -> None:
    program, model, x = block(outputs=outputs)
    events: list[str] = []
    counting(monkeypatch, events)
    with torch.no_grad():
        expected = model(x)
    first = program(x)
    assert torch.equal(first, expected)
    made = events.count("generate")
    # outputs="arena": the recording call takes a bare block, no code compiled for it (the
    # workspace's shapes get theirs when planned, see shape_plans.build).
    assert made == (1 if outputs == "arena" else 2)
    assert program.compiler.last.kernel_note.state is KernelState.ON  # type: ignore[union-attr]
    for _ in range(3):
        assert torch.equal(program(x), expected)
    assert events.count("generate") == made + 1  # the re-planned code, made once, at call 2


def test_without_the_kernel_arena_the_code_is_made_when_the_shape_is_planned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    program, model, x = block(kernel_arena=False)
    events: list[str] = []
    counting(monkeypatch, events)
    with torch.no_grad():
        expected = model(x)
    for _ in range(3):
        assert torch.equal(program(x), expected)
    assert events == ["generate"]  # no recording: the shape's code, made once, serves all


def test_a_shape_seen_first_by_verify_is_recorded_at_its_first_call(
        shim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    program, model, x = block()
    with torch.no_grad():
        expected = model(x)
    program.verify(x)  # plans the shape, runs code of its own
    current = program.compiler.last
    assert current is not None and current.kernel_note.state is KernelState.TO_RECORD
    events: list[str] = []
    counting(monkeypatch, events)
    assert torch.equal(program(x), expected)
    assert events.count("generate") == 1  # the recording's only: nothing made in between
    assert current.kernel_note.state is KernelState.ON
    assert torch.equal(program(x), expected)


def test_the_c_heap_goes_back_after_the_recording_code_is_compiled_and_before_it_runs(
        shim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    program, _, x = block()
    events: list[str] = []
    counting(monkeypatch, events)
    make = kernel_recording.generate_code

    def made(*args: Any, **kwargs: Any) -> Any:
        code = make(*args, **kwargs)
        run = code.run

        def logged_run(inputs: list[Any]) -> Any:
            events.append("run")
            return run(inputs)
        code.run = logged_run
        return code

    monkeypatch.setattr(kernel_recording, "generate_code", made)
    program(x)
    ran = events.index("run")
    assert events[ran - 2:ran + 1] == ["generate", "trim heap", "run"]


def test_the_call_after_the_recording_gives_the_released_tail_back_before_compiling(
        shim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    program, model, x = block()
    program(x)
    events: list[str] = []
    counting(monkeypatch, events)
    with torch.no_grad():
        assert torch.equal(program(x), model(x))
    assert events[:2] == ["trim pools", "generate"]


needs_mkl = pytest.mark.skipif(mkl_buffers.held() is None, reason="torch's MKL is not reachable")


class TwoGemms(torch.nn.Module):
    """Two GEMMs whose MKL packing buffers differ, the smaller first (test_mkl_buffers.py's
    sizes): eager's first call leaves MKL with both."""

    def __init__(self) -> None:
        super().__init__()
        self.small = torch.nn.Linear(768, 2304)
        self.large = torch.nn.Linear(768, 3072)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.small(x), self.large(x)


@pytest.fixture
def one_thread_fresh_mkl() -> Any:
    others = [t.name for t in other_threads()]
    if others:  # consolidate() leaves MKL alone while they run
        pytest.skip(f"earlier tests left Python threads running: {others}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mkl_buffers._service().mkl_serv_free_buffers()
    yield
    torch.set_num_threads(threads)


@needs_mkl
@pytest.mark.parametrize("mkl", [True, False])
def test_the_recorded_call_keeps_one_gemm_buffer_after_each_node(
        shim: Any, monkeypatch: pytest.MonkeyPatch, one_thread_fresh_mkl: Any,
        mkl: bool) -> None:
    torch.manual_seed(0)
    model = TwoGemms().eval()
    x = torch.randn(128, 768)
    program = PlannedProgram.from_module(model, (x,), mkl_buffers=mkl)
    calls: list[Any] = []
    consolidate = kernel_recording.consolidate

    def counted() -> Any:
        calls.append(mkl_buffers.held())
        return consolidate()

    monkeypatch.setattr(kernel_recording, "consolidate", counted)
    with torch.no_grad():
        expected = model(x)
    mkl_buffers._service().mkl_serv_free_buffers()  # eager's buffers gone: the call's own
    got = program(x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    if mkl:
        # Once, after the node that took the second buffer, not at the end of the call.
        assert [c.buffers for c in calls] == [2]
        assert mkl_buffers.held().buffers == 1  # type: ignore[union-attr]
    else:
        assert calls == []
    got = program(x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
