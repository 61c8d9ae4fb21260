"""Planned programs over reordered graphs (``reorder=True``): same outputs as eager PyTorch.

:func:`tensorarena.planning.reorder` picks the order the nodes run in; the executor runs that
order with every intermediate in its slot. Checked against eager execution of the model (not of
the graph): inference and a training step, plain and with every dead slot poisoned (``verify``,
against the graph in its original order).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tensorarena.planning.reorder")

from tensorarena.planning.models import build_model  # noqa: E402
from tensorarena.planning.torch_frontend import default_loss  # noqa: E402
from tensorarena.runtime import PlannedProgram, TrainingStep  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SEARCH_SECONDS = 0.5


def node_names(program: PlannedProgram) -> list[str]:
    """The nodes in the order they run, less the copies of broadcast operands the program
    inserts after reordering (runtime.operands: none in inference graphs)."""
    products = set(program.contiguous_operands)
    scheduled = set(program.schedule.order) if program.schedule is not None else set()
    copies = {arg.name for node in program.compiler.graph.nodes if node.name in products
              for arg in node.args if getattr(arg, "target", None) is torch.ops.aten.clone.default
              and arg.name not in scheduled}
    return [node.name for node in program.compiler.graph.nodes if node.name not in copies]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_reordered_inference_program_equals_eager(name: str) -> None:
    torch.manual_seed(0)
    model, (args, kwargs) = build_model(name, size="tiny")
    model.eval()
    program = PlannedProgram.from_module(model, args, kwargs, reorder=True,
                                         time_limit=SEARCH_SECONDS)
    schedule = program.schedule
    assert schedule is not None and schedule.lower_bound <= schedule.original_lower_bound
    # Here the new order does not raise what the arena holds, so the program runs it (the
    # in-place rewrite renames no node).
    assert program.reordered and node_names(program) == list(schedule.order)
    with torch.no_grad():
        expected = model(*args, **kwargs).to_tuple()
    torch.testing.assert_close(program(*args, **kwargs).to_tuple(), expected)
    program.verify(*args, **kwargs)
    if name == "gpt2":  # the order of attention's ops changes here: the test means something
        plain = PlannedProgram.from_module(model, args, kwargs, time_limit=SEARCH_SECONDS)
        assert node_names(program) != node_names(plain)
        assert schedule.lower_bound < schedule.original_lower_bound


def test_a_reordered_training_step_equals_eager() -> None:
    torch.manual_seed(0)
    model, (args, kwargs) = build_model("gpt2", size="tiny")
    model.train()
    # reorder's order lowers the peak with the gradients counted, but raises that of the
    # activations the arena holds when gradients are fresh outputs: reorder=True keeps the
    # order given, "always" runs the new one.
    kept = TrainingStep(model, args, kwargs, outputs="fresh", reorder=True,
                        time_limit=SEARCH_SECONDS)
    step = TrainingStep(model, args, kwargs, outputs="fresh", reorder="always",
                        time_limit=SEARCH_SECONDS)
    schedule = step.program.schedule
    assert schedule.lower_bound < schedule.original_lower_bound  # a new order, a lower peak
    assert not kept.program.reordered and node_names(kept.program) != list(schedule.order)
    assert step.program.reordered and node_names(step.program) == list(schedule.order)
    torch.manual_seed(1)
    loss, grads = step(*args, **kwargs)
    torch.manual_seed(1)  # the same dropout masks: random ops keep their order
    model.zero_grad(set_to_none=True)
    expected = default_loss(model(*args, **kwargs))
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grads, {n: p.grad for n, p in model.named_parameters()})
    torch.manual_seed(1)
    step.verify(*args, **kwargs)
    kept(*args, **kwargs)
    assert kept.report().planned_bytes < step.report().planned_bytes  # why it was kept
    # With the gradients planned in the arena (the default) the two peaks are one: it runs.
    default = TrainingStep(model, args, kwargs, time_limit=SEARCH_SECONDS)
    assert default.program.outputs == "arena" and default.program.reordered
    torch.manual_seed(1)
    torch.testing.assert_close(default(*args, **kwargs), (loss, grads))


def test_the_order_a_program_runs_does_not_depend_on_its_time_limit() -> None:
    # The search over orders ends on its step budget (the same order on any machine under any
    # load); time_limit bounds the plans only. A thousandth of a second once ended the search
    # before its first step, and the order then depended on the clock.
    from tensorarena.planning.budget import StopReason

    torch.manual_seed(0)
    model, (args, kwargs) = build_model("gpt2", size="tiny")
    model.eval()
    hurried = PlannedProgram.from_module(model, args, kwargs, reorder=True, time_limit=0.001)
    patient = PlannedProgram.from_module(model, args, kwargs, reorder=True, time_limit=1.0)
    assert hurried.schedule is not None and patient.schedule is not None
    assert hurried.schedule.stopped_by is not StopReason.TIME_LIMIT
    assert hurried.schedule.order == patient.schedule.order
