"""The planner's form of an exported program (runtime.export_wire): the same graph, values and
signatures as the program sent, the model's own tensors, and torch's format for what it cannot
carry."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _export_models import Block  # noqa: E402

from tensorarena.runtime.export_wire import lazy_graph_modules, pack, unpack  # noqa: E402


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: Any) -> Any:
        h = self.embed(ids)
        return self.head(h.view(-1, 8).transpose(0, 1).transpose(0, 1))


class Branches(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))


def _own(model: Any) -> dict[str, Any]:
    tensors: dict[str, Any] = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    return tensors


def _trip(model: Any, *args: Any) -> tuple[Any, Any]:
    ep = torch.export.export(model, args)
    data = pack(ep, _own(model))
    assert data is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading it back warns of nothing (LeafSpec)
        return ep, unpack(data, _own(model))


def test_a_static_program_reads_back_as_the_graph_sent_with_the_models_own_tensors() -> None:
    model = Block().eval()
    x = torch.randn(4, 8)
    ep, back = _trip(model, x)
    assert [(n.op, n.name, n.target) for n in back.graph.nodes] == \
        [(n.op, n.name, n.target) for n in ep.graph.nodes]
    for sent, read in zip(ep.graph.nodes, back.graph.nodes, strict=True):
        if isinstance(sent.meta.get("val"), torch.Tensor):
            assert read.meta["val"].shape == sent.meta["val"].shape, sent.name
            assert read.meta["val"].stride() == sent.meta["val"].stride(), sent.name
            assert read.meta["val"].dtype == sent.meta["val"].dtype, sent.name
    own = _own(model)
    assert list(back.state_dict) == list(ep.state_dict)
    assert all(back.state_dict[name] is own[name] for name in back.state_dict)
    assert back.constants["scale"] is model.scale  # a non-persistent buffer
    lifted = [v for k, v in back.constants.items() if k not in own]
    assert [float(v) for v in lifted] == [1.0]  # lifted out of the code: travels whole
    assert back.graph_signature == ep.graph_signature
    assert back.call_spec == ep.call_spec
    assert torch.equal(back.module()(x), model(x))


def test_nodes_named_as_python_builtins_keep_their_names() -> None:
    # nn.Sequential's argument is named ``input``: FX renames a new node of a builtin's name
    # (``input_1``), which the program's signature would no longer match.
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    ep, back = _trip(model, x)
    assert "input" in [n.name for n in ep.graph.nodes]
    assert [n.name for n in back.graph.nodes] == [n.name for n in ep.graph.nodes]
    assert torch.equal(back.module()(x), model(x))


def test_tied_weights_and_views_share_fake_storages_as_in_the_export() -> None:
    model = Tied().eval()
    ep, back = _trip(model, torch.tensor([[1, 2, 3]]))
    from tensorarena.planning.torch_frontend import problem_from_exported

    here, there = problem_from_exported(ep), problem_from_exported(back)
    assert there.aliases == here.aliases and there.aliases
    assert there.problem == here.problem


def test_example_inputs_keep_their_structure_as_shapes() -> None:
    model = Block().eval()
    _, back = _trip(model, torch.randn(4, 8))
    (x,), kwargs = back.example_inputs
    assert kwargs == {} and x.is_meta and x.shape == (4, 8)


def test_symbolic_shapes_and_subgraphs_are_left_to_torchs_format() -> None:
    batch = torch.export.Dim("batch", min=2, max=64)
    model = Block().eval()
    dynamic = torch.export.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    assert pack(dynamic, _own(model)) is None
    branches = torch.export.export(Branches(), (torch.randn(3),))
    assert pack(branches, {}) is None


def test_a_program_holding_what_pickle_cannot_write_is_left_to_torchs_format() -> None:
    model = Block().eval()
    ep = torch.export.export(model, (torch.randn(4, 8),))
    ep._constants["unpicklable"] = lambda: None  # as a custom class pickle cannot write
    assert pack(ep, _own(model)) is None


def _described(graph: Any) -> list[Any]:
    """Every node's value as plain data: its structure, each tensor's layout, and its storage
    numbered in first-seen order (equal lists: the same partition into shared storages)."""
    storages: dict[int, int] = {}

    def describe(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = storages.setdefault(value.untyped_storage()._cdata, len(storages))
            return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(),
                    value.dtype, value.device, value.requires_grad, key)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, [describe(v) for v in value])
        if isinstance(value, dict):
            return ("dict", [(k, describe(v)) for k, v in value.items()])
        return ("value", type(value).__name__, value)

    return [(n.name, describe(n.meta["val"]) if "val" in n.meta else "none") for n in graph.nodes]


def _propagated(back: Any) -> list[Any]:
    """The values ``propagate_fakes`` gives ``back``'s graph from its placeholders' values (what
    unpack gave them before values travelled as specs)."""
    from torch._guards import detect_fake_mode

    from tensorarena.runtime.export_wire import propagate_fakes

    graph = back.graph
    values = [n.meta["val"] for n in graph.find_nodes(op="placeholder")]
    for node in graph.nodes:
        if node.op != "placeholder":
            node.meta.pop("val", None)
    propagate_fakes(graph, values, detect_fake_mode(values))
    return _described(graph)


@pytest.mark.parametrize(("name", "train"), [
    ("gpt2", False), ("bert", False), ("llama", False), ("t5", False), ("vit", False),
    ("resnet", False), ("whisper-encoder", False), ("gpt2", True)])
def test_values_made_from_specs_equal_a_fake_propagations(name: str, train: bool) -> None:
    # Same structure, layout, dtype, device and requires_grad for every node, and the same
    # partition of values into shared storages (views, in-place results, eval-mode dropout's
    # alias of its input, tied weights). ``train``: dropout runs (native_dropout's two
    # outputs), batch norm updates its running statistics in place.
    from tensorarena.planning.models import build_model

    model, (args, kwargs) = build_model(name, size="tiny")
    model.train(train)
    with torch.no_grad():  # as the runtime exports
        ep = torch.export.export(model, tuple(args), dict(kwargs), strict=False)
    data = pack(ep, _own(model))
    assert data is not None
    back = unpack(data, _own(model))
    sent = _described(back.graph)
    assert sum(1 for _, value in sent if value != "none") > 0.9 * len(sent)
    assert sent == _propagated(back)


class Reinterpreted(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        y = x * 2
        bits = y.view(torch.int32)  # one storage read under two dtypes
        return bits[1:] + 1, y.t()[0]


def test_a_storage_read_under_two_dtypes_stays_one_storage() -> None:
    _, back = _trip(Reinterpreted(), torch.randn(4, 4))
    values = {n.name: n.meta["val"] for n in back.graph.nodes if n.op == "call_function"}
    y, bits = values["mul"], values["view"]
    assert bits.dtype == torch.int32 and y.dtype == torch.float32
    assert bits.untyped_storage()._cdata == y.untyped_storage()._cdata
    assert _described(back.graph) == _propagated(back)


def test_reading_a_program_back_runs_no_operator_on_fake_tensors(monkeypatch: Any) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = Tied().eval()
    ep = torch.export.export(model, (torch.tensor([[1, 2, 3]]),))
    data = pack(ep, _own(model))
    assert data is not None

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an operator ran through the fake mode")

    monkeypatch.setattr(FakeTensorMode, "dispatch", refused)
    back = unpack(data, _own(model))
    assert all("val" in n.meta for n in back.graph.nodes)


def test_the_read_back_module_writes_its_code_only_when_something_runs_it(
        monkeypatch: Any) -> None:
    from torch.export import exported_program as torch_export_module
    from torch.fx._lazy_graph_module import _LazyGraphModule

    made = torch_export_module._create_graph_module_for_export
    written: list[int] = []
    real = torch.fx.Graph.python_code

    def python_code(graph: Any, *args: Any, **kwargs: Any) -> Any:
        written.append(len(graph.nodes))
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", python_code)
    model = Block().eval()
    x = torch.randn(4, 8)
    ep = torch.export.export(model, (x,))
    data = pack(ep, _own(model))
    assert data is not None
    written.clear()
    back = unpack(data, _own(model))
    assert written == []  # read back: no forward written, none compiled
    assert isinstance(back.graph_module, _LazyGraphModule)
    assert torch_export_module._create_graph_module_for_export is made  # put back
    assert "def forward" in back.graph_module.code and written  # written once asked for
    assert torch.equal(back.module()(x), model(x))


def test_lazy_modules_are_made_only_within_and_put_back_after_an_error() -> None:
    from torch.export import exported_program as torch_export_module

    made = torch_export_module._create_graph_module_for_export
    with pytest.raises(RuntimeError, match="in the middle"), lazy_graph_modules(torch):
        assert torch_export_module._create_graph_module_for_export is not made
        raise RuntimeError("in the middle")
    assert torch_export_module._create_graph_module_for_export is made
    gm = made(torch.nn.Module(), torch.fx.Graph())
    assert type(gm).__mro__[1] is torch.fx.GraphModule  # eager again outside


def test_a_torch_without_lazy_modules_reads_back_as_before(monkeypatch: Any) -> None:
    from torch.fx import _lazy_graph_module

    monkeypatch.delattr(_lazy_graph_module, "_LazyGraphModule")
    model = Block().eval()
    x = torch.randn(4, 8)
    _ep, back = _trip(model, x)
    assert type(back.graph_module).__mro__[1] is torch.fx.GraphModule
    assert "def forward" in back.graph_module.code
    assert torch.equal(back.module()(x), model(x))


def test_lazy_modules_nest_in_one_thread_and_put_back_torchs_own() -> None:
    from torch.export import exported_program as torch_export_module

    made = torch_export_module._create_graph_module_for_export
    with lazy_graph_modules(torch):
        outer = torch_export_module._create_graph_module_for_export
        with lazy_graph_modules(torch):  # no deadlock
            assert torch_export_module._create_graph_module_for_export is not made
        assert torch_export_module._create_graph_module_for_export is outer
    assert torch_export_module._create_graph_module_for_export is made
