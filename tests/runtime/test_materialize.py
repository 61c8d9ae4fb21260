"""Buffers carry their layout, and materialize() lays a tensor over each planned offset."""

from __future__ import annotations

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError  # noqa: E402
from tensorarena.planning import Buffer, Plan, Problem, naive, plan  # noqa: E402
from tensorarena.planning.graph_problem import TensorSpec  # noqa: E402
from tensorarena.planning.torch_frontend import problem_from_exported  # noqa: E402
from tensorarena.runtime import materialize  # noqa: E402
from tensorarena.runtime.materialize import slot  # noqa: E402

pytestmark = pytest.mark.torch


class Strided(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.mm(x, x.t())  # (4, 4) float32, contiguous
        t = h.t().contiguous()  # a copy: its own buffer
        i = (t > 0).to(torch.int64)  # int64
        return (t * i).sum()


def exported() -> torch.export.ExportedProgram:
    return torch.export.export(Strided(), (torch.randn(4, 3),))


def test_every_planned_buffer_carries_a_layout_that_matches_its_size() -> None:
    gp = problem_from_exported(exported())
    assert set(gp.tensors) == {b.id for b in gp.problem.buffers}
    for buffer in gp.problem.buffers:
        assert gp.tensors[buffer.id].nbytes == buffer.nbytes
    assert gp.tensors["mm"] == TensorSpec((4, 4), (4, 1), "float32", 4)
    int64 = [spec for spec in gp.tensors.values() if spec.dtype == "int64"]
    assert int64 and all(spec.itemsize == 8 for spec in int64)


def test_spec_nbytes_counts_the_strided_extent() -> None:
    assert TensorSpec((2, 3), (1, 2), "float32", 4).nbytes == 24
    assert TensorSpec((2, 3), (6, 1), "float16", 2, storage_offset=1).nbytes == (1 + 1 + 6 + 2) * 2
    assert TensorSpec((0, 3), (3, 1), "float32", 4).nbytes == 0


def test_materialize_places_each_tensor_at_its_offset() -> None:
    gp = problem_from_exported(exported())
    result = plan(gp.problem)
    memory = CountingMemory()
    m = materialize(gp, result, resource=memory)
    assert m.block.dtype == torch.uint8 and m.block.numel() == result.height == m.nbytes
    assert memory.allocations == 1 and memory.owns(m.block.data_ptr())
    base = m.block.data_ptr()
    for buffer, offset in zip(result.problem.buffers, result.offsets, strict=True):
        tensor = m.tensors[buffer.id]
        spec = gp.tensors[buffer.id]
        assert tensor.data_ptr() == base + offset
        assert tuple(tensor.shape) == spec.shape and tensor.stride() == spec.stride
        assert str(tensor.dtype) == f"torch.{spec.dtype}"
    del m, tensor
    assert memory.live == {}  # the block went back when its tensors died


def test_buffers_live_together_do_not_share_bytes() -> None:
    gp = problem_from_exported(exported())
    result = plan(gp.problem)
    m = materialize(gp, result)
    buffers = result.problem.buffers
    for a in buffers:
        for b in buffers:
            if a.id < b.id and a.overlaps_in_time(b):
                m.tensors[a.id].view(-1).view(torch.uint8).fill_(1)
                m.tensors[b.id].view(-1).view(torch.uint8).fill_(2)
                assert bool((m.tensors[a.id].view(torch.uint8) == 1).all())


def test_materialize_rejects_a_plan_of_other_buffers() -> None:
    gp = problem_from_exported(exported())
    other = Problem([Buffer("mm", 0, 1, 12345)])
    with pytest.raises(InvalidArgumentError, match="mm"):
        materialize(gp, naive(other))
    unknown = Problem([Buffer("nope", 0, 1, 16)])
    with pytest.raises(InvalidArgumentError, match="nope"):
        materialize(gp, Plan(unknown, (0,)))


def test_materialize_names_arguments_of_the_wrong_kind() -> None:
    gp = problem_from_exported(exported())
    memory = CountingMemory()
    with pytest.raises(InvalidArgumentError, match="plan must be a Plan"):
        materialize(gp, memory)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="graph must be a GraphProblem"):
        materialize(None, plan(gp.problem))  # type: ignore[arg-type]


def test_slot_refuses_what_does_not_fit_or_is_misaligned() -> None:
    memory = torch.zeros(64, dtype=torch.uint8)
    spec = TensorSpec((4,), (1,), "float32", 4)
    assert slot(memory, 48, spec).data_ptr() == memory.data_ptr() + 48
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        slot(memory, 52, spec)
    with pytest.raises(InvalidArgumentError, match="multiple"):
        slot(memory, 2, spec)
