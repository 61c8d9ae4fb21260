"""Allocation traces: what torch's allocator does during eager and planned calls."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.runtime import PlannedProgram  # noqa: E402
from tensorarena.runtime.measure import trace_allocations  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_trace_counts_each_allocation_and_the_peak() -> None:
    x = torch.randn(64, 64)  # 16 KiB

    def three(x: torch.Tensor) -> torch.Tensor:
        a = x @ x  # 16 KiB
        b = a.relu()  # 16 KiB while a lives
        return b.sum()  # 4 bytes, while a and b are still referenced

    result, trace = trace_allocations(three, x)
    assert result.shape == ()
    assert trace.allocations == 3 and trace.frees == 2
    assert trace.allocated_bytes == trace.peak_bytes == 2 * 16384 + 4
    assert trace.by_path == {"outside": 3} and trace.planned_allocations == 0



def test_freeing_memory_from_before_the_call_hides_none_of_its_own_peak() -> None:
    held: list[torch.Tensor] = []
    trace_allocations(lambda: held.append(torch.randn(64, 64)))  # 16 KiB, profiled: size known

    def drop_then_allocate() -> torch.Tensor:
        held.clear()
        return torch.randn(32, 64)  # 8 KiB

    _, trace = trace_allocations(drop_then_allocate)
    assert trace.frees == 1 and trace.allocations == 1
    assert trace.peak_bytes == 8192  # not 8 KiB above a level 16 KiB lower


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 128), torch.nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up(x).relu()).sum()


def test_planned_intermediates_take_nothing_from_torchs_allocator() -> None:
    torch.manual_seed(0)
    model, x = Mlp().eval(), torch.randn(16, 32)
    program = PlannedProgram.from_module(model, (x,))
    program(x)
    with torch.no_grad():
        _, eager = trace_allocations(model, x)
    result, planned = program.trace_allocations(x)
    torch.testing.assert_close(result, model(x))
    assert eager.allocations == 4  # up, relu, down, sum
    assert planned.by_path == {}  # the output is planned too (outputs="handover")
    assert planned.planned_allocations == 0
    assert planned.peak_bytes < eager.peak_bytes


class Scalars(torch.nn.Module):
    """Python numbers in Tensor positions (mul, add, ne, lt, where), a factory (arange), ``&``,
    ``mean`` (whose CPU out variant divides by a count it wraps) and a reshape that copies:
    each made ATen allocate at every call before numbers were made once and out variants
    widened."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) * 0.125 + 1.0
        mask = (ids != 0) & (ids < 7)
        h = h + torch.arange(32, dtype=torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)  # RMSNorm: mean made a sum
        h = torch.where(mask.unsqueeze(-1), h, -1.0)  # where.ScalarOther: where.self's out
        h = h.t().reshape(256).view(32, 8).t()  # a reshape that copies: straight into its slot
        return (h * 3).sum(), mask.sum()


def test_numbers_factories_and_dunders_take_nothing_from_torchs_allocator() -> None:
    from tensorarena.runtime.ops import out_variant

    aten = torch.ops.aten
    assert out_variant(aten.arange.default).dropped >= {"dtype", "device"}  # type: ignore[union-attr]
    assert out_variant(aten.__and__.Tensor).op is aten.bitwise_and.Tensor_out  # type: ignore[union-attr]
    torch.manual_seed(0)
    model = Scalars().eval()
    x, ids = torch.randn(8, 32), torch.randint(0, 10, (8,))
    program = PlannedProgram.from_module(model, (x, ids))
    program(x, ids)
    result, planned = program.trace_allocations(x, ids)
    with torch.no_grad():
        torch.testing.assert_close(result, model(x, ids), rtol=0, atol=0)  # bit for bit
        _, eager = trace_allocations(model, x, ids)
    assert eager.allocations >= 10  # numbers wrapped at every call, eagerly
    assert planned.planned_allocations == 0, planned.by_path
    assert planned.by_path == {}  # the outputs are planned too (outputs="handover")
