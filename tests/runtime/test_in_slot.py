"""Kernels run in their slot: the same bits as ATen's, without its table of its own."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.runtime import PlannedProgram, TrainingStep  # noqa: E402
from tensorarena.runtime.execute import annotated_call  # noqa: E402
from tensorarena.runtime.in_slot import embedding_dense_backward_into, written_in_slot  # noqa: E402
from tensorarena.runtime.measure import profile  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("padding_idx", [-1, 0, 3])
def test_embedding_backward_in_the_slot_is_atens_bit_for_bit(dtype: torch.dtype,
                                                             padding_idx: int) -> None:
    torch.manual_seed(0)
    grad = torch.randn(2, 16, 32, dtype=dtype)
    indices = torch.randint(0, 10, (2, 16))
    indices[0, :5] = 3  # repeated rows, and the padding row when it is 3
    expected = torch.ops.aten.embedding_dense_backward(grad, indices, 10, padding_idx, False)
    out = torch.full((10, 32), float("nan"), dtype=dtype)
    assert embedding_dense_backward_into(out, grad, indices, padding_idx) is out
    assert torch.equal(out, expected)


class Embedded(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(64, 16, padding_idx=1)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids)).relu()


def test_a_planned_steps_embedding_gradient_is_eagers_and_torch_allocates_no_table() -> None:
    torch.manual_seed(0)
    model = Embedded().train()
    ids = torch.randint(0, 64, (4, 8))
    ids[0, 0] = 1
    step = TrainingStep(model, (ids,), reorder=False)
    _, grads = step(ids)
    model(ids).sum().backward()
    assert torch.equal(grads["table.weight"], model.table.weight.grad)
    inputs = step.program.compiler.signature.flatten((ids,), {})
    _, profiled = profile(annotated_call(step.program.compiler, inputs))
    table = 64 * 16 * 4
    in_backward = [size for _, size, _, _, node, _ in profiled.events
                   if node.startswith("embedding_dense_backward") and size > 0]
    assert in_backward == [] or max(in_backward) < table


def test_an_embedding_writes_its_rows_into_its_slot_without_an_allocation() -> None:
    torch.manual_seed(0)
    model = Embedded().eval()
    ids = torch.randint(0, 64, (4, 8))
    program = PlannedProgram.from_module(model, (ids,))
    with torch.no_grad():
        assert torch.equal(program(ids), model(ids))
    inputs = program.compiler.signature.flatten((ids,), {})
    _, profiled = profile(annotated_call(program.compiler, inputs))
    assert "embedding" in profiled.nodes  # the node ran, annotated
    assert [e for e in profiled.events if e[4] == "embedding" and e[1] > 0] == []


class Transposed(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ x).t().clone(memory_format=torch.contiguous_format) * 2


def test_a_clone_copies_into_its_slot_without_an_allocation() -> None:
    x = torch.randn(16, 16)
    program = PlannedProgram.from_module(Transposed(), (x,))
    assert torch.equal(program(x), Transposed()(x))
    inputs = program.compiler.signature.flatten((x,), {})
    _, profiled = profile(annotated_call(program.compiler, inputs))
    assert "clone" in profiled.nodes
    assert [e for e in profiled.events if e[4] == "clone" and e[1] > 0] == []


class Factories(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        doubled = torch.full_like(x, 2.0) * x
        wide = x.to(torch.float64) + torch.ones_like(x, dtype=torch.float64)
        return doubled + wide.float() + torch.zeros_like(x) + x.new_ones(x.shape)


def test_factories_and_conversions_fill_their_slots_without_an_allocation() -> None:
    x = torch.randn(8, 16)
    program = PlannedProgram.from_module(Factories(), (x,))
    assert torch.equal(program(x), Factories()(x))
    written = [n.name for n in program.compiler.graph.nodes if written_in_slot(n) is not None]
    assert len(written) == 4  # full_like, ones_like, zeros_like, new_ones (export keeps to.dtype)
    inputs = program.compiler.signature.flatten((x,), {})
    _, profiled = profile(annotated_call(program.compiler, inputs))
    assert set(written) <= set(profiled.nodes)
    assert [e for e in profiled.events if e[4] in written and e[1] > 0] == []
