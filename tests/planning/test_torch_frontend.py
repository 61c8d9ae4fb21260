"""The PyTorch front end on small real graphs: exact buffers, aliasing, multi-output, training."""

from __future__ import annotations

import subprocess
import sys

import pytest
from graph_checks import check_consistent

torch = pytest.importorskip("torch")


from tensorarena.errors import InvalidArgumentError, InvalidProblemError  # noqa: E402
from tensorarena.planning.graph_problem import GraphProblem  # noqa: E402
from tensorarena.planning.torch_frontend import (  # noqa: E402
    exported_problems,
    problem_from_exported,
    problem_from_fx,
    trace_training,
)

pytestmark = pytest.mark.torch


def export(module: torch.nn.Module, *args: torch.Tensor) -> GraphProblem:
    return problem_from_exported(torch.export.export(module, args))




class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.mm(x, self.w)  # step 2
        v = h.view(8)  # 3: a view of h
        s = torch.sigmoid(v)  # 4
        s.mul_(2.0)  # 5: in place on s
        t = s + v  # 6: last use of v, so of h
        return t.sum(), s  # 7, then the output node at 8


def test_tiny_module_buffers_by_hand() -> None:
    gp = export(Tiny(), torch.ones(2, 4))
    # Nodes: 0 p_w, 1 x, 2 mm, 3 view, 4 sigmoid, 5 mul_, 6 add, 7 sum_1, 8 output.
    assert gp.steps == 9
    got = [(b.id, b.start, b.end, b.nbytes, b.alignment) for b in gp.problem.buffers]
    assert got == [
        ("mm", 2, 7, 32, 64),  # lives to the view's last use at step 6
        ("sigmoid", 4, 9, 32, 64),  # an output (through mul_): lives to the end
        ("add", 6, 8, 32, 64),
        ("sum_1", 7, 9, 4, 64),
    ]
    assert gp.aliases == {"view": "mm", "mul_": "sigmoid"}
    assert gp.unplanned == {"p_w": 64, "x": 32}
    assert gp.unplanned_kinds == {"p_w": "parameter", "x": "input"}
    assert gp.outputs == ("sum_1", "sigmoid")
    assert gp.lower_bound() == 32 + 32 + 32  # mm, sigmoid and add live at step 6
    check_consistent(gp)


def test_alignment_and_name_are_passed_through() -> None:
    ep = torch.export.export(Tiny(), (torch.ones(2, 4),))
    gp = problem_from_exported(ep, alignment=256, name="tiny")
    assert gp.name == "tiny"
    assert {b.alignment for b in gp.problem.buffers} == {256}


class Chain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        z = y.view(4, 8).transpose(0, 1).unsqueeze(0).squeeze(0).permute(1, 0).flatten()
        w = z[3:].reshape(29)
        return (w + 1).sum()


def test_view_chains_are_aliases_not_buffers() -> None:
    gp = export(Chain(), torch.ones(32))
    ep = torch.export.export(Chain(), (torch.ones(32),))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert len(gp.problem) < len(calls)
    mul = next(b for b in gp.problem.buffers if b.id == "mul")
    add = next(b for b in gp.problem.buffers if b.id == "add")
    # Every view resolves to the root, and the root lives until the last view is used.
    assert {root for root in gp.aliases.values()} == {"mul"}
    assert mul.end == add.start + 1
    check_consistent(gp)


class Copies(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        viewed = y.reshape(32)  # y is contiguous: a view
        copied = y.t().reshape(32)  # y.t() is not: reshape copies
        return viewed * 2, copied * 3


def test_reshape_views_contiguous_and_copies_strided_inputs() -> None:
    gp = export(Copies(), torch.ones(4, 8))
    ids = {b.id for b in gp.problem.buffers}
    assert gp.aliases["reshape"] == "add"
    assert "reshape_1" in ids and gp.aliases["t"] == "add"
    copy = next(b for b in gp.problem.buffers if b.id == "reshape_1")
    assert copy.nbytes == 32 * 4
    check_consistent(gp)


class InPlace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.relu_()
        y.add_(1)
        z = torch.sigmoid(y)
        return z + y


def test_in_place_ops_extend_rather_than_create() -> None:
    gp = export(InPlace(), torch.ones(16))
    ids = [b.id for b in gp.problem.buffers]
    assert ids == ["mul", "sigmoid", "add"]
    assert gp.aliases == {"relu_": "mul", "add_": "mul"}
    mul = gp.problem.buffers[0]
    add = gp.problem.buffers[2]
    assert mul.end == add.start + 1  # the in-place chain is used by the final add
    check_consistent(gp)


class MultiOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, indices = x.max(dim=1)  # two fresh outputs
        top, where = torch.topk(x, 2)  # two more
        a, b = torch.split(x * 1, 4, dim=1)  # views of their input: no new buffers
        return values.sum() + top.sum() + a.sum() + b.sum() + indices.sum() + where.sum()


def test_multi_output_nodes_give_one_buffer_per_output() -> None:
    gp = export(MultiOutput(), torch.ones(3, 8))
    by_id = {b.id: b for b in gp.problem.buffers}
    ep = torch.export.export(MultiOutput(), (torch.ones(3, 8),))
    getitems = {
        n.name: (n.args[0].name, n.args[1])
        for n in ep.graph.nodes
        if n.op == "call_function" and n.target.__name__ == "getitem"
    }
    produced = {name for name, (parent, _) in getitems.items() if parent in ("max_1", "topk")}
    assert produced <= set(by_id)
    sizes = sorted(by_id[name].nbytes for name in produced)
    assert sizes == sorted([3 * 4, 3 * 8, 3 * 2 * 4, 3 * 2 * 8])  # float32 values, int64 indices
    split_items = [name for name, (parent, _) in getitems.items() if parent == "split"]
    assert split_items and all(gp.aliases[name] == "mul" for name in split_items)
    check_consistent(gp)


def test_unused_output_of_a_multi_output_node_is_still_allocated() -> None:
    class Unused(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.topk(x, 2).values * 2

    gp = export(Unused(), torch.ones(2, 8))
    indices = [b for b in gp.problem.buffers if b.nbytes == 2 * 2 * 8]
    assert len(indices) == 1 and indices[0].end == indices[0].start + 1
    check_consistent(gp)


class State(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.offset = torch.ones(4)  # a plain tensor attribute: a lifted constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale + self.offset


def test_parameters_buffers_constants_and_inputs_are_reported_not_planned() -> None:
    gp = export(State(), torch.ones(2, 8))
    assert gp.unplanned_kinds == {
        "p_lin_weight": "parameter",
        "p_lin_bias": "parameter",
        "b_scale": "buffer",
        "c_offset": "constant",
        "x": "input",
    }
    assert gp.unplanned == {
        "p_lin_weight": 128,
        "p_lin_bias": 16,
        "b_scale": 16,
        "c_offset": 16,
        "x": 64,
    }
    assert gp.unplanned_bytes_of("parameter") == 144
    assert gp.unplanned_bytes == 240
    assert not {b.id for b in gp.problem.buffers} & set(gp.unplanned)
    check_consistent(gp)


def test_tied_weights_are_counted_once() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(tokens))

    gp = export(Tied(), torch.tensor([[1, 2, 3]]))
    assert gp.unplanned_bytes_of("parameter") == 10 * 4 * 4
    assert len([k for k in gp.unplanned if gp.unplanned_kinds[k] == "parameter"]) == 1
    assert any(alias.startswith("p_") for alias in gp.aliases)
    check_consistent(gp)


def test_higher_order_ops_are_opaque_nodes() -> None:
    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():  # exported as wrap_with_set_grad_enabled over a subgraph
                z = x * 2 + 1
            w = torch.cond(x.sum() > 0, lambda a: a.sin(), lambda a: a.cos(), (z,))
            return z + w

    gp = export(Branchy(), torch.ones(2, 4))
    by_id = {b.id: b for b in gp.problem.buffers}
    # The subgraphs' outputs are buffers of the nodes that call them; their insides are not.
    assert {"getitem", "getitem_1"} <= set(by_id)
    assert by_id["getitem"].nbytes == by_id["getitem_1"].nbytes == 32
    assert not {"mul", "sin", "cos"} & set(by_id)
    check_consistent(gp)


def test_symbolic_shape_raises_naming_the_tensor() -> None:
    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    batch = torch.export.Dim("batch")
    ep = torch.export.export(Double(), (torch.ones(3, 4),), dynamic_shapes={"x": {0: batch}})
    with pytest.raises(InvalidProblemError, match=r"'x'.*symbolic"):
        problem_from_exported(ep)


# -- plain torch.fx: ShapeProp metadata, aliasing from op schemas ------------------------------


class Traced(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        v = y.view(8, 4).transpose(0, 1)  # views
        c = v.reshape(32)  # non-contiguous input: a copy
        a, b = torch.split(y, 2)  # views
        m, i = y.max(dim=1)  # two fresh outputs
        return c.sum() + a.sum() + b.sum() + m.sum() + i.sum()


def test_fx_graph_with_shape_prop_uses_schemas_for_aliasing() -> None:
    from torch.fx.passes.shape_prop import ShapeProp

    gm = torch.fx.symbolic_trace(Traced())
    ShapeProp(gm).propagate(torch.ones(4, 8))
    gp = problem_from_fx(gm)
    ids = {b.id for b in gp.problem.buffers}
    assert "relu" in ids and "reshape" in ids
    assert gp.aliases["view"] == "relu" and gp.aliases["transpose"] == "relu"
    assert gp.aliases["getitem"] == "relu" and gp.aliases["getitem_1"] == "relu"
    assert {"getitem_2", "getitem_3"} <= ids  # max's values and indices
    assert gp.unplanned == {"x": 128}
    check_consistent(gp)


def test_dynamo_graph_uses_example_values() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, inputs: object) -> object:
        graphs.append(gm)
        return gm.forward

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = torch.split(self.lin(x).view(2, 4, 8).transpose(1, 2), 4, dim=1)
            return (a + b).relu_().sum()

    torch.compile(Net(), backend=capture, fullgraph=True)(torch.ones(8, 8))
    gp = problem_from_fx(graphs[0])
    assert [(b.id, b.nbytes) for b in gp.problem.buffers] == [
        ("linear", 256),
        ("add", 128),
        ("sum_1", 4),
    ]
    assert set(gp.aliases.values()) == {"linear", "add"}
    assert gp.unplanned_bytes_of("parameter") == 256 + 32
    assert gp.unplanned_bytes_of("input") == 256
    check_consistent(gp)


def test_fx_graph_without_shapes_is_rejected() -> None:
    gm = torch.fx.symbolic_trace(Traced())
    with pytest.raises(InvalidProblemError, match="no shape metadata"):
        problem_from_fx(gm)


# -- training graphs ---------------------------------------------------------------------------


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(16, 64)
        self.down = torch.nn.Linear(64, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_training_graph_has_more_buffers_and_a_higher_bound(mode: str) -> None:
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(8, 16)
    inference = export(model.eval(), x)
    training = problem_from_fx(trace_training(model.train(), (x,), tracing_mode=mode))
    assert len(training.problem) > len(inference.problem)
    assert training.lower_bound() > inference.lower_bound()
    # The parameters are inputs of the training graph, reported as such, never planned.
    params = sum(p.numel() * 4 for p in model.parameters())
    assert training.unplanned_bytes_of("parameter") == params
    assert training.unplanned_bytes_of("input") == x.numel() * 4
    # Outputs are the loss and one gradient per parameter, all live at the end.
    grads = [b for b in training.problem.buffers if b.id in training.outputs]
    assert sum(b.nbytes for b in grads) >= params
    check_consistent(training)


def test_trace_training_with_a_custom_loss_and_kwargs() -> None:
    model = MLP()
    gm = trace_training(model, (), {"x": torch.randn(4, 16)}, loss_fn=lambda out: (out**2).mean())
    kinds = [n.meta.get("tensorarena_kind") for n in gm.graph.nodes if n.op == "placeholder"]
    assert kinds == ["parameter"] * 6 + ["input"]
    check_consistent(problem_from_fx(gm))


@pytest.mark.parametrize("mode", ["fake", "real"])
def test_a_traced_step_writes_its_code_only_when_something_runs_it(
        monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    written: list[int] = []
    real = torch.fx.Graph.python_code

    def python_code(graph: torch.fx.Graph, *args: object, **kwargs: object) -> object:
        written.append(len(graph.nodes))
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", python_code)
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 16)
    gm = trace_training(model.train(), (x,), tracing_mode=mode)
    assert written == []  # the step's whole forward and backward: not written, not compiled
    check_consistent(problem_from_fx(gm))
    params = [p.detach() for p in model.parameters()]
    loss, *grads = gm(params, [], (x,), {})  # run: written now, and right
    assert written and torch.allclose(loss, MLP.forward(model, x).float().sum())
    assert len(grads[0]) == len(params)


def test_trace_training_needs_a_trainable_parameter() -> None:
    model = MLP().requires_grad_(False)
    with pytest.raises(InvalidProblemError, match="trainable"):
        trace_training(model, (torch.randn(2, 16),))


def test_importing_the_front_ends_does_not_import_torch() -> None:
    code = (
        "import sys, tensorarena, tensorarena.planning, tensorarena.planning.torch_frontend, "
        "tensorarena.planning.onnx_frontend, tensorarena.planning.models; "
        "assert 'torch' not in sys.modules and 'onnx' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("not_exported", [None, 3, "model.pt2", torch.nn.Linear(2, 2)])
def test_something_not_exported_is_refused_by_name(not_exported: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"expected a torch\.export\.ExportedProgram"):
        exported_problems(not_exported)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"expected a torch\.export\.ExportedProgram"):
        problem_from_exported(not_exported)  # type: ignore[arg-type]
