"""Real-model problems: every architecture traces, plans and validates; training costs more.

Most tests need torch and transformers; the checks of arguments, made before either is imported,
run without them.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from tensorarena.errors import (
    InvalidArgumentError,
    MissingDependencyError,
    UnknownNameError,
)
from tensorarena.planning import (
    models,
    naive,
    validate,
)
from tensorarena.planning.graph_problem import GraphProblem
from tensorarena.planning.models import (
    ARCHITECTURES,
    ModelSkippedWarning,
    build_model,
    model_problem,
    model_problems,
)

HAVE_TORCH = all(importlib.util.find_spec(name) for name in ("torch", "transformers"))
_skip_without_torch = pytest.mark.skipif(
    not HAVE_TORCH, reason="needs torch and transformers (the torch and models extras)"
)


def needs_torch(test: Any) -> Any:
    """Mark ``test`` as a torch test (``-m torch``), skipped where torch is missing."""
    return pytest.mark.torch(_skip_without_torch(test))



@pytest.fixture(scope="module")
def inference() -> dict[str, GraphProblem]:
    return dict(model_problems(size="tiny", training=False, errors="raise"))


@pytest.fixture(scope="module")
def training() -> dict[str, GraphProblem]:
    return dict(model_problems(size="tiny", training=True, errors="raise"))


@needs_torch
def test_at_least_six_architectures_including_the_required_four(
    inference: dict[str, GraphProblem], training: dict[str, GraphProblem]
) -> None:
    assert len(ARCHITECTURES) >= 6
    assert {"gpt2", "bert", "vit", "resnet"} <= set(ARCHITECTURES)
    assert list(inference) == list(ARCHITECTURES) == list(training)


@needs_torch
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_problems_are_well_formed_and_plan(
    name: str, inference: dict[str, GraphProblem], training: dict[str, GraphProblem]
) -> None:
    for gp, mode in ((inference[name], "infer"), (training[name], "train")):
        assert gp.name == f"{name}-tiny-{mode}"
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
        plan = naive(gp.problem)
        validate(gp.problem, plan)
        assert gp.lower_bound() <= plan.height <= gp.planned_bytes + 64 * len(gp.problem)


@needs_torch
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


@needs_torch
def test_parameters_match_the_model(inference: dict[str, GraphProblem]) -> None:
    model, _ = build_model("bert", size="tiny")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert inference["bert"].unplanned_bytes_of("parameter") == params


@needs_torch
def test_batch_scales_activations_not_weights() -> None:
    one = dict(model_problems(names=["bert"], batch=1, errors="raise"))["bert"]
    four = dict(model_problems(names=["bert"], batch=4, errors="raise"))["bert"]
    assert four.lower_bound() > 2 * one.lower_bound()
    assert four.unplanned_bytes_of("parameter") == one.unplanned_bytes_of("parameter")


@needs_torch
def test_a_failing_architecture_is_skipped_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("cannot export this one")

    monkeypatch.setitem(models._BUILDERS, "bert", broken)
    with pytest.warns(ModelSkippedWarning, match="bert.*cannot export this one"):
        got = [name for name, _ in model_problems(names=["bert", "resnet"])]
    assert got == ["resnet"]
    with pytest.raises(RuntimeError, match="cannot export"):
        list(model_problems(names=["bert"], errors="raise"))


@pytest.mark.parametrize(
    "call",
    [
        lambda: model_problem("gpt3"),
        lambda: build_model("gpt3"),
        lambda: model_problems(names=["bert", "gpt3"]),  # at the call, not when iterated
        lambda: model_problem(None),
    ],
)
def test_an_unknown_architecture_names_the_known_ones(call: Any) -> None:
    with pytest.raises(UnknownNameError) as info:
        call()
    assert "unknown architecture" in str(info.value)
    assert all(name in str(info.value) for name in ARCHITECTURES)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: build_model("bert", size="huge"), "size must be one of 'tiny', 'base'"),
        (lambda: model_problem("bert", size="small"), "size must be one of"),
        (lambda: model_problems(size=None), "size must be one of"),
        (lambda: model_problem("bert", batch=0), "batch must be a positive int"),
        (lambda: model_problems(batch=2.0), "batch must be a positive int"),
        (lambda: model_problem("bert", training="yes"), "training must be a bool"),
        (lambda: model_problems(errors="ignore"), "errors must be 'warn' or 'raise'"),
        (lambda: model_problems(names="bert"), "names must be a list of names"),
        (lambda: model_problems(names=3), "names must be a list of names"),
        (lambda: build_model("bert", seq=0), "seq must be a positive int"),
        (lambda: build_model("resnet", seq=16), "resnet takes no token sequence"),
    ],
)
def test_bad_arguments_are_invalid_arguments(call: Any, words: str) -> None:
    # A model size is a name, not a byte count: not an InvalidSizeError.
    with pytest.raises(InvalidArgumentError, match=words):
        call()


@needs_torch
def test_seq_sets_the_length_of_the_token_sequences() -> None:
    _, (args, _) = build_model("gpt2", batch=1, seq=32)
    assert tuple(args[0].shape) == (1, 32)
    _, (args, kwargs) = build_model("t5", seq=20)  # the decoder gets a quarter
    assert tuple(args[0].shape) == (2, 20) and tuple(kwargs["decoder_input_ids"].shape) == (2, 5)
    with pytest.raises(InvalidArgumentError, match="seq=65 is longer than GPT-2's 64 positions"):
        build_model("gpt2", seq=65)


@needs_torch
def test_whisper_tiny_encoder_is_a_variant_built_by_name() -> None:
    assert "whisper-tiny-encoder" in models.VARIANTS
    assert "whisper-tiny-encoder" not in ARCHITECTURES  # model_problems yields it only if named
    encoder, (args, _) = build_model("whisper-tiny-encoder", size="base", batch=1)
    assert (encoder.config.d_model, encoder.config.encoder_layers) == (384, 4)
    assert tuple(args[0].shape) == (1, 80, 3000)  # 30 s of audio
    tiny, _ = build_model("whisper-tiny-encoder")
    same, _ = build_model("whisper-encoder")
    assert tiny.config.d_model == same.config.d_model == 64


@needs_torch
def test_models_are_deterministic() -> None:
    a = dict(model_problems(names=["gpt2"], errors="raise"))["gpt2"]
    b = dict(model_problems(names=["gpt2"], errors="raise"))["gpt2"]
    assert a.problem == b.problem


# -- the front end against a real execution ----------------------------------------------------


class _Recorder:
    """Runs a graph on real tensors and keeps every value (so no storage is freed and reused)."""

    def __init__(self, gm: Any) -> None:
        import torch

        class Interpreter(torch.fx.Interpreter):
            def run_node(inner, node: Any) -> Any:  # `self` is the recorder's
                out = super().run_node(node)
                inputs = {
                    self.values[arg.name].untyped_storage().data_ptr()
                    for arg in node.all_input_nodes
                    if arg.name in self.values
                }
                values = out if isinstance(out, (list, tuple)) else [out]
                names = (
                    [f"{node.name}.{k}" for k in range(len(values))]
                    if isinstance(out, (list, tuple))
                    else [node.name]
                )
                for name, value in zip(names, values, strict=True):
                    if isinstance(value, torch.Tensor):
                        self.values[name] = value
                        if value.untyped_storage().data_ptr() in inputs:
                            self.reused.add(name)
                return out

        self.values: dict[str, Any] = {}
        self.reused: set[str] = set()  # outputs that came back in one of their inputs' storage
        self.interpreter = Interpreter(gm, garbage_collect_values=False)

    def storage(self, name: str) -> tuple[int, int]:
        storage = self.values[name].untyped_storage()
        return storage.data_ptr(), storage.nbytes()


def _check_against_execution(gp: GraphProblem, run: _Recorder) -> None:
    # Every alias we claim really shares its root's bytes: a false alias would be unsafe.
    for alias, root in gp.aliases.items():
        if alias in run.values and root in run.values and run.values[alias].numel():
            start, nbytes = run.storage(root)
            assert start <= run.storage(alias)[0] < start + nbytes, (alias, root)
    # Every planned buffer is as large as the storage the kernel gave it, and distinct buffers
    # have distinct storages, except where a kernel's real strides differ from its fake ones
    # (a `contiguous` after attention may then find nothing to copy): conservative, not unsafe.
    owners: dict[int, str] = {}
    for b in gp.problem.buffers:
        if b.id in run.reused:
            assert "contiguous" in b.id, b.id
            continue
        ptr, nbytes = run.storage(b.id)
        assert ptr not in owners or not nbytes, (b.id, owners.get(ptr))
        owners[ptr] = b.id
        assert nbytes == b.nbytes, (b.id, nbytes, b.nbytes)


@needs_torch
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_inference_problem_matches_a_real_execution(name: str) -> None:
    import torch
    from torch.export.graph_signature import InputKind
    from torch.utils import _pytree as pytree

    from tensorarena.planning.torch_frontend import problem_from_exported

    model, (args, kwargs) = build_model(name, size="tiny")
    model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, args, kwargs, strict=False)
    user = iter(pytree.tree_leaves((args, kwargs)))
    state = {
        **dict(model.named_parameters(remove_duplicate=False)),  # tied weights under each name
        **dict(model.named_buffers(remove_duplicate=False)),
        **ep.constants,
    }
    inputs = [
        next(user) if spec.kind == InputKind.USER_INPUT else state[spec.target]
        for spec in ep.graph_signature.input_specs
    ]
    run = _Recorder(ep.graph_module)
    with torch.no_grad():
        run.interpreter.run(*inputs)
    _check_against_execution(problem_from_exported(ep), run)


@needs_torch
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_training_problem_matches_a_real_execution(name: str) -> None:
    import torch
    from torch.utils import _pytree as pytree

    from tensorarena.planning.torch_frontend import problem_from_fx, trace_training

    model, (args, kwargs) = build_model(name, size="tiny")
    model.train()
    gm = trace_training(model, args, kwargs)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    run = _Recorder(gm)
    torch.manual_seed(0)
    run.interpreter.run(
        *pytree.tree_leaves((list(params.values()), list(buffers.values()), args, kwargs))
    )
    _check_against_execution(problem_from_fx(gm), run)


def test_missing_transformers_names_the_models_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError, match=r"tensorarena\[models\]"):
        model_problems(names=["gpt2"])
