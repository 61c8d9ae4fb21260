"""Broadcast operands of matrix products: copied into a planned buffer, the same bits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.runtime import TrainingStep  # noqa: E402
from tensorarena.runtime.execute import annotated_call  # noqa: E402
from tensorarena.runtime.measure import profile  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_broadcast_gradient_of_a_sum_is_copied_into_the_arena_before_its_product() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 64, bias=False)).train()
    x = torch.randn(16, 8)
    step = TrainingStep(model, (x,), reorder=False)
    assert step.program.contiguous_operands  # d(sum)/d(out) is ones expanded: stride 0
    _, grads = step(x)
    model(x).sum().backward()
    for name, p in model.named_parameters():
        assert torch.equal(grads[name], p.grad), name
    inputs = step.program.compiler.signature.flatten((x,), {})
    _, profiled = profile(annotated_call(step.program.compiler, inputs))
    products = set(step.program.contiguous_operands)
    assert [e for e in profiled.events if e[4] in products and e[1] > 0] == []
