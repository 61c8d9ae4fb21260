"""Exporting a module for a planned program: transformers' KV caches, inputs without data,
sizes and branches that depend on values, and torch's errors turned into ours."""

from __future__ import annotations

import inspect
import os
import traceback
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tensorarena.errors import (  # noqa: E402
    DataDependentError,
    ExportFailedError,
    InvalidArgumentError,
)
from tensorarena.runtime import PlannedProgram, exporting  # noqa: E402

pytestmark = pytest.mark.torch


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


def refuse_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any call of torch.export.export fail the test: the check must come first."""
    def export(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("torch.export.export was called")

    monkeypatch.setattr(torch.export, "export", export)


# ----------------------------------------------------------------------------------------------
# transformers models with their default use_cache=True
# ----------------------------------------------------------------------------------------------


def cached_model(name: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A tiny transformers model as its config makes it by default: with the KV cache on
    (the model zoo turns it off for its benchmarks)."""
    pytest.importorskip("transformers")
    from tensorarena.planning.models import build_model

    model, (args, kwargs) = build_model(name)
    config = model.config
    config.use_cache = True
    return type(model)(config).eval(), args, kwargs  # made anew: T5 copies it per stack


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "t5"])
def test_a_model_with_its_default_cache_returns_what_eager_does(name: str) -> None:
    from torch.utils import _pytree as pytree

    model, args, kwargs = cached_model(name)
    program = PlannedProgram.from_module(model, args, kwargs)
    got = program(*args, **kwargs)
    with torch.no_grad():
        expected = model(*args, **kwargs)
    assert type(got) is type(expected)
    assert type(got.past_key_values) is type(expected.past_key_values)
    assert got.past_key_values.get_seq_length() == expected.past_key_values.get_seq_length() > 0
    got_leaves, got_spec = pytree.tree_flatten(got)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    assert got_spec == expected_spec
    assert len(got_leaves) == len(expected_leaves) > 1  # the cache's tensors are outputs too
    for a, b in zip(got_leaves, expected_leaves, strict=True):
        torch.testing.assert_close(a, b)
    program.verify(*args, **kwargs)


@pytest.mark.slow
def test_generation_goes_on_from_the_programs_cache_as_from_eagers() -> None:
    model, (tokens,), _ = cached_model("gpt2")
    program = PlannedProgram.from_module(model, (tokens,))
    cache = program(tokens).past_key_values
    step = tokens[:, -1:]
    # transformers 5.2x renamed past_key_values (the name of older versions) to cache.
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        expected = model(step, **{name: model(tokens).past_key_values})
        got = model(step, **{name: cache})
    torch.testing.assert_close(got.logits, expected.logits)
    assert got.past_key_values.get_seq_length() == tokens.shape[1] + 1


@pytest.mark.slow
def test_without_a_cache_registration_the_cache_is_turned_off_unless_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, (tokens,), _ = cached_model("gpt2")
    monkeypatch.setattr(exporting, "_register_caches", lambda model: False)
    program = PlannedProgram.from_module(model, (tokens,))
    assert model.config.use_cache is True  # turned off for the export only
    got = program(tokens)  # called as the model is: use_cache is no argument of the program
    with torch.no_grad():
        expected = model(tokens)
    assert got.past_key_values is None and expected.past_key_values is not None
    torch.testing.assert_close(got.logits, expected.logits)
    # Asked for, the cache is exported as the caller says (and fails here, unregistered).
    seen = []
    monkeypatch.setattr(torch.export, "export",
                        lambda *a, **k: seen.append(model.config.use_cache) or 1 / 0)
    with pytest.raises(ExportFailedError):
        PlannedProgram.from_module(model, (tokens,), {"use_cache": True})
    assert seen == [True]


def test_the_caches_are_registered_whatever_the_caller_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model, (tokens,), _ = cached_model("gpt2")
    registered = []
    monkeypatch.setattr(exporting, "_register_caches", lambda model: registered.append(1) or True)
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: "exported")
    for kwargs in ({}, {"use_cache": True}, {"use_cache": False}):
        exporting.export_module(model, (tokens,), kwargs, dynamic_shapes=None, strict=False)
    assert len(registered) == 3
    exporting.export_module(Linear(), (torch.randn(2, 8),), {}, dynamic_shapes=None, strict=False)
    assert len(registered) == 3  # not a transformers model


def test_a_cache_export_cannot_flatten_says_to_pass_use_cache_false() -> None:
    class StateCache:  # a class torch's pytree does not know, named as caches are
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, StateCache]:
            return x + 1, StateCache(x * 2)

    with pytest.raises(ExportFailedError) as info:
        PlannedProgram.from_module(Model(), (torch.randn(3),))
    first, advice = str(info.value).splitlines()[:2]
    assert "could not capture Model: its output holds a StateCache" in first
    assert "use_cache=False" in advice and "register_pytree_node" in advice
    assert isinstance(info.value.__cause__, Exception)


# ----------------------------------------------------------------------------------------------
# Tensors without data
# ----------------------------------------------------------------------------------------------


def test_a_meta_input_is_refused_before_the_export_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_export(monkeypatch)
    x = torch.empty(2, 8, device="meta")
    with pytest.raises(InvalidArgumentError, match=r"args\[0\] is a tensor on the meta device "
                       r"\(shape \(2, 8\), torch\.float32, no data\).*torch\.zeros"):
        PlannedProgram.from_module(Linear(), (x,))
    with pytest.raises(InvalidArgumentError, match=r"kwargs\['x'\] is a tensor on the meta"):
        PlannedProgram.from_module(Linear(), (), {"x": x})


def test_meta_weights_are_refused_before_the_export(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_export(monkeypatch)
    with torch.device("meta"):
        model = Linear()
    with pytest.raises(InvalidArgumentError,
                       match=r"2 of the model's 2 parameters and buffers are on the meta device "
                             r"\(first 'fc.weight'\).*to_empty"):
        PlannedProgram.from_module(model, (torch.randn(2, 8),))


# ----------------------------------------------------------------------------------------------
# Values that decide a size or a branch
# ----------------------------------------------------------------------------------------------


class Masked(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2


class NonZero(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x).float() + 1


class Branch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x + 1
        return x - 1


@pytest.mark.parametrize(("model", "node", "code"), [
    (Masked(), "index", "x[x > 0] * 2"),
    (NonZero(), "nonzero", "torch.nonzero(x)"),
])
def test_a_size_that_depends_on_values_names_the_node_and_the_line(
        model: torch.nn.Module, node: str, code: str) -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
    with pytest.raises(DataDependentError) as info:
        PlannedProgram.from_module(model, (x,))
    first = str(info.value).splitlines()[0]
    assert f"the size of tensor {node!r}" in first and "depends on the values" in first
    assert "test_exporting.py:" in first and code in first
    assert "torch.compile(model, backend='tensorarena')" in str(info.value)
    assert info.value.where.startswith("test_exporting.py:")
    # The program exported by hand is refused the same way, before planning.
    with pytest.raises(DataDependentError):
        PlannedProgram.from_exported(torch.export.export(model, (x,)))


def test_a_branch_on_a_value_is_our_error_with_the_models_line_and_torchs_as_cause() -> None:
    with pytest.raises(DataDependentError) as info:
        PlannedProgram.from_module(Branch(), (torch.randn(3),))
    error = info.value
    assert isinstance(error, ExportFailedError)
    first = str(error).splitlines()[0]
    assert first.startswith("torch.export could not capture Branch: a branch or a size")
    assert error.where.startswith("test_exporting.py:") and error.where.endswith("in forward")
    cause = error.__cause__
    assert cause is not None and "data-dependent" in str(cause)
    # Its traceback keeps the model's frames and the one that raised, not torch's tracing.
    frames = traceback.extract_tb(cause.__traceback__)
    torch_dir = os.path.dirname(torch.__file__)
    inside = [f for f in frames[:-1] if f.filename.startswith(torch_dir)]
    assert not inside and len(frames) <= 5
    assert any(f.name == "forward" and f.filename == __file__ for f in frames)


def test_any_other_failure_says_what_to_try_in_one_line_then_advice() -> None:
    with pytest.raises(ExportFailedError) as info:
        PlannedProgram.from_module(Linear(), (torch.randn(2, 7),))  # 7 features, not 8
    lines = str(info.value).splitlines()
    assert lines[0].startswith("torch.export could not capture Linear: RuntimeError: ")
    assert len(lines[0]) < 300
    assert lines[1].startswith("What to try: torch.compile")
    assert not isinstance(info.value, DataDependentError)
    assert isinstance(info.value.__cause__, RuntimeError)


# ----------------------------------------------------------------------------------------------
# What export writes for a tensor made from data
# ----------------------------------------------------------------------------------------------


class MadeFromData(torch.nn.Module):
    """``torch.tensor([])`` in forward, as transformers' ``DynamicCache`` makes its first keys:
    export writes ``lift_fresh_copy`` then ``detach_``, and the copy is planned in a slot."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tensor([]).view(1, 0), x], dim=1) * 2


def test_a_tensor_made_from_data_is_detached_in_its_slot() -> None:
    x = torch.randn(1, 3)
    ep = torch.export.export(MadeFromData(), (x,))
    assert torch.ops.aten.detach_.default in [n.target for n in ep.graph.nodes]
    program = PlannedProgram.from_exported(ep)
    torch.testing.assert_close(program(x), MadeFromData()(x))
    torch.testing.assert_close(program(x), MadeFromData()(x))
    paths = {n.node: n.path for n in program.report().nodes}
    assert paths["lift_fresh_copy"] == "out"  # planned: its slot is a view of the arena
    program.verify(x)


def test_a_deleted_program_leaves_no_traced_graph_behind() -> None:
    import gc
    import weakref

    def graphs() -> dict[int, torch.fx.GraphModule]:
        gc.collect()
        return {id(o): o for o in gc.get_objects() if isinstance(o, torch.fx.GraphModule)}

    model, x = Linear().eval(), torch.randn(2, 8)
    before = graphs()
    program = PlannedProgram.from_module(model, (x,))
    program(x)
    made = [weakref.ref(g) for i, g in graphs().items() if i not in before]
    assert made
    del program
    gc.collect()
    # torch 2.13's export kept its last traced graph in a module-level map; it is cleared
    assert [ref for ref in made if ref() is not None] == []


def test_the_export_leaves_no_source_lines_of_files_on_disk_in_linecache(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import linecache

    (tmp_path / "lines_model.py").write_text(
        "import torch\n\n\nclass Doubler(torch.nn.Module):\n"
        "    def forward(self, x):\n        return (x * 2).relu()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("lines_model")
    source = module.__file__
    x = torch.randn(3)
    torch.export.export(module.Doubler(), (x,))  # torch's export reads the model's lines
    assert source in linecache.cache
    linecache.cache.pop(source)
    fx_sources = {k for k, v in linecache.cache.items() if len(v) == 4 and v[1] is None}
    exporting.export_module(module.Doubler(), (x,), {}, dynamic_shapes=None, strict=False)
    assert source not in linecache.cache
    # sources without a file on disk (FX's generated code) stay readable
    assert fx_sources <= set(linecache.cache)
    assert linecache.getline(source, 6).strip() == "return (x * 2).relu()"  # read again
