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
    assert planned.by_path == {"dynamic": 1}  # the output only
    assert planned.planned_allocations == 0
    assert planned.peak_bytes < eager.peak_bytes
