"""trace_training where fake tracing fails (torch 2.11's ``GuardOnDataDependentSymNode:
Eq(u0, 1)`` on one architecture, issue 12): traced again with real tensors, or skipped with the
model-skipped warning, never an error out of :func:`model_problems`. The failure is forced, so
these tests run on any torch."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch.fx.experimental.proxy_tensor as proxy_tensor  # noqa: E402

from tensorarena.errors import InvalidProblemError  # noqa: E402
from tensorarena.planning.models import (  # noqa: E402
    ModelSkippedWarning,
    build_model,
    model_problems,
)
from tensorarena.planning.torch_frontend import (  # noqa: E402
    TRACING_MODE_KEY,
    problem_from_fx,
    trace_training,
)

pytestmark = pytest.mark.torch

ARCHITECTURE = "distilbert"


def _guard_error() -> BaseException:
    import sympy
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return GuardOnDataDependentSymNode(sympy.Eq(sympy.Symbol("u0"), 1),
                                       "Could not guard on data-dependent expression Eq(u0, 1)")


def _failing_make_fx(monkeypatch: pytest.MonkeyPatch, failing: set[str]) -> list[str]:
    """make_fx that raises the torch 2.11 guard error in the ``failing`` modes; the modes tried."""
    real_make_fx = proxy_tensor.make_fx
    tried: list[str] = []

    def make_fx(fn: Any, *args: Any, tracing_mode: str = "real", **kwargs: Any) -> Any:
        tried.append(tracing_mode)
        if tracing_mode in failing:
            def fail(*inputs: Any) -> Any:
                raise _guard_error()
            return fail
        return real_make_fx(fn, *args, tracing_mode=tracing_mode, **kwargs)

    monkeypatch.setattr(proxy_tensor, "make_fx", make_fx)
    return tried


def _model() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    model, (args, kwargs) = build_model(ARCHITECTURE, size="tiny")
    return model.train(), tuple(args), dict(kwargs)


def test_fake_tracing_that_hits_a_data_dependent_guard_falls_back_to_real(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, args, kwargs = _model()
    expected = problem_from_fx(trace_training(model, args, kwargs))
    tried = _failing_make_fx(monkeypatch, {"fake"})
    gm = trace_training(model, args, kwargs)
    assert tried == ["fake", "real"]
    assert gm.meta[TRACING_MODE_KEY] == "real"
    got = problem_from_fx(gm)
    # The same step, traced another way: the same buffers and the same bound.
    assert sorted(b.nbytes for b in got.problem.buffers) == sorted(
        b.nbytes for b in expected.problem.buffers)
    assert got.lower_bound() == expected.lower_bound()
    assert got.unplanned_bytes_of("parameter") == expected.unplanned_bytes_of("parameter") > 0


def test_a_step_no_mode_can_trace_is_a_project_error_and_a_skipped_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, args, kwargs = _model()
    _failing_make_fx(monkeypatch, {"fake", "real"})
    with pytest.raises(InvalidProblemError, match=r"fake tensors .*Eq\(u0, 1\).* real ones"):
        trace_training(model, args, kwargs)
    with pytest.warns(ModelSkippedWarning, match=f"skipped {ARCHITECTURE}.*Eq"):
        assert dict(model_problems(names=[ARCHITECTURE], training=True)) == {}


def test_fake_tracing_that_works_stays_fake() -> None:
    model, args, kwargs = _model()
    assert trace_training(model, args, kwargs).meta[TRACING_MODE_KEY] == "fake"
