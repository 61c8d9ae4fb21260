"""Real transformers architectures (random weights, tiny configs): planned outputs equal eager.

Three routes, each against eager PyTorch with ``torch.testing.assert_close``'s default
tolerances: a ``torch.export`` program through :class:`PlannedProgram` (inference), a training
step through :class:`TrainingStep` (the loss and every gradient), and ``torch.compile`` with the
tensorarena backend (inference, and a training step through ``aot_autograd``'s forward and
backward graphs). Every planned route is also run poisoned (``verify``).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tensorarena.planning.models import build_model  # noqa: E402
from tensorarena.planning.torch_frontend import default_loss  # noqa: E402
from tensorarena.runtime import PlannedProgram  # noqa: E402
from tensorarena.runtime.backend import Backend, register_backend  # noqa: E402
from tensorarena.runtime.training import TrainingStep  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ARCHITECTURES = ["gpt2", "bert", "vit", "resnet", "t5", "llama"]


def plain(output: Any) -> Any:
    """transformers' ModelOutput as a tuple, anything else as is."""
    return output.to_tuple() if hasattr(output, "to_tuple") else output


def eager_step(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               seed: int) -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss = default_loss(model(*args, **kwargs))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_same_gradients(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        if grad is None:
            assert got[name] is None or not got[name].any(), name
        else:
            torch.testing.assert_close(got[name], grad, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_inference_through_the_planned_program_equals_eager(name: str) -> None:
    model, (args, kwargs) = build_model(name)
    model.eval()
    program = PlannedProgram.from_module(model, args, kwargs)
    with torch.no_grad():
        expected = plain(model(*args, **kwargs))
    torch.testing.assert_close(plain(program(*args, **kwargs)), expected)
    torch.testing.assert_close(plain(program(*args, **kwargs)), expected)  # steady state
    program.verify(*args, **kwargs)
    report = program.report()
    # Outputs in a handed-over tail (the default): two blocks, each planned on its own, whose
    # peaks fall at different times, so their sum can be a little above the bound of all.
    assert report.buffers > 0 and report.planned_bytes <= 1.08 * report.lower_bound
    assert report.tail_bytes > 0
    fresh = PlannedProgram.from_module(model, args, kwargs, outputs="fresh")
    torch.testing.assert_close(plain(fresh(*args, **kwargs)), expected)
    report = fresh.report()  # one block: at its bound
    assert report.buffers > 0 and report.planned_bytes <= 1.01 * report.lower_bound


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_training_step_as_one_planned_program_equals_eager(name: str) -> None:
    model, (args, kwargs) = build_model(name)
    model.train()  # dropout on: both runs draw the same masks from the same seed
    step = TrainingStep(model, args, kwargs)
    torch.manual_seed(1)
    loss, grads = step(*args, **kwargs)
    expected_loss, expected_grads = eager_step(model, args, kwargs, seed=1)
    torch.testing.assert_close(loss, expected_loss)
    assert_same_gradients(grads, expected_grads)
    torch.manual_seed(1)
    step.verify(*args, **kwargs)
    report = step.report()
    # Saved activations are intermediates of the one graph: planned, not outputs.
    assert report.buffers > 0 and report.planned_bytes < report.naive_bytes


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_torch_compile_with_the_tensorarena_backend_equals_eager(name: str) -> None:
    model, (args, kwargs) = build_model(name)
    backend = Backend()
    torch._dynamo.reset()
    model.eval()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(plain(compiled(*args, **kwargs)), plain(model(*args, **kwargs)))
    assert [p.name.split()[-1] for p in backend.programs] == ["inference"]

    torch._dynamo.reset()
    model.train()
    compiled = torch.compile(model, backend=backend)
    torch.manual_seed(2)
    model.zero_grad(set_to_none=True)
    loss = default_loss(compiled(*args, **kwargs))
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    expected_loss, expected_grads = eager_step(model, args, kwargs, seed=2)
    torch.testing.assert_close(loss.detach(), expected_loss)
    assert_same_gradients(grads, expected_grads)
    kinds = [p.name.split()[-1] for p in backend.programs[1:]]
    assert kinds == ["forward", "backward"]  # one captured graph: no graph break
    assert all(p.report().buffers > 0 for p in backend.programs)


def test_the_backend_is_found_by_name_once_registered() -> None:
    register_backend()
    register_backend()  # idempotent
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tensorarena")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
