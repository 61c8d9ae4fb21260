"""TrainingStep: example inputs and parameters checked, parameters read at every call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError, ShapeNotCoveredError  # noqa: E402
from tensorarena.runtime import PlannedProgram, TrainingStep  # noqa: E402

pytestmark = pytest.mark.torch


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def eager_grads(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def test_a_parameter_replaced_after_tracing_is_the_one_the_step_uses() -> None:
    model, x = net(), torch.randn(4, 8)
    step = TrainingStep(model, (x,))
    step(x)
    model[2] = torch.nn.Linear(16, 4)  # a new head, same shapes
    _, grads = step(x)
    torch.testing.assert_close(grads, eager_grads(model, x))


def test_a_parameter_of_another_dtype_or_shape_is_refused_by_name() -> None:
    model, x = net(), torch.randn(4, 8)
    step = TrainingStep(model, (x,))
    model.half()
    with pytest.raises(ShapeNotCoveredError, match=r"'0\.weight' has dtype torch\.float16"):
        step(x)
    model.float()
    model[0].weight.data = torch.randn(32, 8)
    with pytest.raises(ShapeNotCoveredError, match=r"0\.weight\.shape\[0\] is 32"):
        step(x)


def test_an_example_tensor_instead_of_a_tuple_is_refused_not_iterated_by_rows() -> None:
    model, x = net(), torch.randn(4, 8)
    with pytest.raises(InvalidArgumentError, match=r"write \(x,\)"):
        TrainingStep(model, x)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"write \(x,\)"):
        PlannedProgram.from_module(model.eval(), x)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="kwargs must be a dict"):
        PlannedProgram.from_module(model.eval(), (x,), [x])  # type: ignore[arg-type]
