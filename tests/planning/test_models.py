"""Real-model problems: every architecture traces, plans and validates; training costs more."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tensorarena.planning import (
    Plan,
    Problem,
    models,
    validate,
)
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.models import (
    ARCHITECTURES,
    ModelSkippedWarning,
    build_model,
    model_problems,
)

pytestmark = pytest.mark.torch


def prefix_sum_plan(problem: Problem) -> Plan:
    offsets, top = [], 0
    for b in problem.buffers:
        offset = -(-top // b.alignment) * b.alignment
        offsets.append(offset)
        top = offset + b.nbytes
    return Plan(problem, tuple(offsets), planner="prefix-sum")


@pytest.fixture(scope="module")
def inference() -> dict[str, GraphProblem]:
    return dict(model_problems(size="small", training=False, errors="raise"))


@pytest.fixture(scope="module")
def training() -> dict[str, GraphProblem]:
    return dict(model_problems(size="small", training=True, errors="raise"))


def test_at_least_six_architectures_including_the_required_four(
    inference: dict[str, GraphProblem], training: dict[str, GraphProblem]
) -> None:
    assert len(ARCHITECTURES) >= 6
    assert {"gpt2", "bert", "vit", "resnet"} <= set(ARCHITECTURES)
    assert list(inference) == list(ARCHITECTURES) == list(training)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_problems_are_well_formed_and_plan(
    name: str, inference: dict[str, GraphProblem], training: dict[str, GraphProblem]
) -> None:
    for gp, mode in ((inference[name], "infer"), (training[name], "train")):
        assert gp.name == f"{name}-small-{mode}"
        assert len(gp.problem) > 0 and gp.lower_bound() > 0
        assert gp.unplanned_bytes_of("parameter") > 0
        ids = {b.id for b in gp.problem.buffers}
        assert not ids & set(gp.unplanned)
        for b in gp.problem.buffers:
            assert 0 <= b.start < b.end <= gp.steps
        for out in gp.outputs:
            assert next(b for b in gp.problem.buffers if b.id == out).end == gp.steps
        # Views are everywhere in transformers: fewer buffers than tensor-producing nodes.
        assert gp.aliases
        plan = prefix_sum_plan(gp.problem)
        validate(gp.problem, plan)
        assert gp.lower_bound() <= plan.height <= gp.planned_bytes + 64 * len(gp.problem)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_training_needs_more_than_inference(
    name: str, inference: dict[str, GraphProblem], training: dict[str, GraphProblem]
) -> None:
    assert len(training[name].problem) > len(inference[name].problem)
    assert training[name].lower_bound() > inference[name].lower_bound()
    # Same weights either way (tied weights counted once in both).
    assert training[name].unplanned_bytes_of("parameter") == pytest.approx(
        inference[name].unplanned_bytes_of("parameter"), rel=0.05
    )


def test_parameters_match_the_model(inference: dict[str, GraphProblem]) -> None:
    model, _ = build_model("bert", size="small")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert inference["bert"].unplanned_bytes_of("parameter") == params


def test_batch_scales_activations_not_weights() -> None:
    one = dict(model_problems(names=["bert"], batch=1, errors="raise"))["bert"]
    four = dict(model_problems(names=["bert"], batch=4, errors="raise"))["bert"]
    assert four.lower_bound() > 2 * one.lower_bound()
    assert four.unplanned_bytes_of("parameter") == one.unplanned_bytes_of("parameter")


def test_a_failing_architecture_is_skipped_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("cannot export this one")

    monkeypatch.setitem(models._BUILDERS, "bert", broken)
    with pytest.warns(ModelSkippedWarning, match="bert.*cannot export this one"):
        got = [name for name, _ in model_problems(names=["bert", "resnet"])]
    assert got == ["resnet"]
    with pytest.raises(RuntimeError, match="cannot export"):
        list(model_problems(names=["bert"], errors="raise"))


def test_unknown_names_and_sizes_are_errors() -> None:
    with pytest.raises(KeyError, match="unknown architecture"):
        model_problems(names=["no-such-model"])  # at the call, not when iterated
    with pytest.raises(ValueError, match="size"):
        build_model("bert", size="huge")  # type: ignore[arg-type]


def test_models_are_deterministic() -> None:
    a = dict(model_problems(names=["gpt2"], errors="raise"))["gpt2"]
    b = dict(model_problems(names=["gpt2"], errors="raise"))["gpt2"]
    assert a.problem == b.problem
