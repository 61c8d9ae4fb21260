"""The ONNX front end: hand-built graphs checked by hand, models exported from torch."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from graph_checks import check_consistent

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from tensorarena.errors import (  # noqa: E402
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidProblemError,
)
from tensorarena.planning.onnx_frontend import problem_from_onnx  # noqa: E402

pytestmark = pytest.mark.onnx

F32 = TensorProto.FLOAT




def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def small_graph(batch: int | str = 2) -> onnx.ModelProto:
    """x[batch, 4] @ W[4, 8] -> h; relu(h) -> r; r + h -> y; reshape(y) -> z (output)."""
    weight = helper.make_tensor("W", F32, [4, 8], [0.5] * 32)
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [-1])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "h"], ["y"], name="add"),
        helper.make_node("Reshape", ["y", "shape"], ["z"], name="reshape"),
    ]
    return make_model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [batch, 4])],
        [helper.make_tensor_value_info("z", F32, None)],
        [weight, shape],
    )


def test_hand_built_graph_buffers_by_hand() -> None:
    gp = problem_from_onnx(small_graph(), alias_reshapes=False)
    assert gp.steps == 4
    got = [(b.id, b.start, b.end, b.nbytes, b.alignment) for b in gp.problem.buffers]
    assert got == [
        ("h", 0, 3, 64, 64),  # used by relu (1) and add (2)
        ("r", 1, 3, 64, 64),
        ("y", 2, 4, 64, 64),
        ("z", 3, 4, 64, 64),  # the graph output lives to the end
    ]
    assert gp.unplanned == {"W": 128, "shape": 8, "x": 32}
    assert gp.unplanned_kinds == {"W": "parameter", "shape": "parameter", "x": "input"}
    assert gp.outputs == ("z",)
    assert gp.lower_bound() == 128 + 64  # h, r, y at step 2
    check_consistent(gp)


def test_reshapes_share_their_input_by_default_as_in_onnx_runtime() -> None:
    gp = problem_from_onnx(small_graph())
    assert [b.id for b in gp.problem.buffers] == ["h", "r", "y"]
    assert gp.aliases == {"z": "y"}
    assert gp.problem.buffers[2].end == gp.steps  # y is the output, through z
    check_consistent(gp)


def test_symbolic_dimension_names_the_tensor_and_input_shapes_pins_it() -> None:
    model = small_graph(batch="batch")
    with pytest.raises(InvalidProblemError, match=r"'x'.*symbolic dimension 'batch'"):
        problem_from_onnx(model)
    gp = problem_from_onnx(model, input_shapes={"x": (3, 4)})
    assert [b.nbytes for b in gp.problem.buffers] == [96, 96, 96]
    # The model passed in is left as it was.
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"nope": (2, 4)}, "not a graph input"),
        ({"x": (2, 4, 1)}, "rank 2"),
        ({"x": (2, -4)}, "non-negative"),
        ({"x": 8}, "sequence of non-negative ints"),  # TypeError: not iterable
        ({"x": None}, "sequence of non-negative ints"),
        ({"x": "2,4"}, "sequence of non-negative ints"),  # was read as ['2', ',', '4']
        ({"x": (True, 4)}, "non-negative ints"),
    ],
)
def test_bad_input_shapes_are_rejected(shapes: dict[str, Any], match: str) -> None:
    model = small_graph(batch="batch")
    with pytest.raises(InvalidProblemError, match=match):
        problem_from_onnx(model, input_shapes=shapes)


@pytest.mark.parametrize(("batch", "shape", "says"), [
    (2, (3, 4), "[2, 4], which the shape given, [3, 4], contradicts (dimension 0 is 2, not 3)"),
    ("batch", (3, 5), "['batch', 4], which the shape given, [3, 5], contradicts (dimension 1 "
                      "is 4, not 5)"),
])
def test_a_shape_that_contradicts_a_static_export_is_refused_not_ignored(
        batch: int | str, shape: tuple[int, int], says: str) -> None:
    # The static (2, 4) export was planned at (3, 4) without a word: another model's plan.
    model = small_graph(batch=batch)
    with pytest.raises(InvalidProblemError) as info:
        problem_from_onnx(model, input_shapes={"x": shape})
    assert "input 'x' was exported with the static shape " + says in str(info.value)
    # the export's own static dimensions are accepted, the symbolic ones filled in
    assert problem_from_onnx(small_graph(), input_shapes={"x": (2, 4)}).problem.lower_bound() \
        == problem_from_onnx(small_graph()).problem.lower_bound()


def test_bad_options_are_refused_before_the_model_is_read() -> None:
    model = small_graph(batch="batch")
    with pytest.raises(InvalidArgumentError, match="input_shapes must map"):
        problem_from_onnx(model, input_shapes=[("x", (2, 4))])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="alias_reshapes must be a bool"):
        problem_from_onnx(model, input_shapes={"x": (2, 4)},
                          alias_reshapes="no")  # type: ignore[arg-type]  # was truthy: on
    with pytest.raises(InvalidAlignmentError, match="alignment"):
        problem_from_onnx(model, input_shapes={"x": (2, 4)}, alignment=3)
    pinned = problem_from_onnx(model, input_shapes={"x": np.array([2, 4])})
    assert pinned.problem.lower_bound() == problem_from_onnx(
        model, input_shapes={"x": (2, 4)}).problem.lower_bound()


def test_unknown_output_type_names_the_tensor() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Mystery", ["a"], ["b"], domain="custom.domain"),
        helper.make_node("Relu", ["b"], ["c"]),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [2, 2])],
        [helper.make_tensor_value_info("c", F32, None)],
    )
    model.opset_import.append(helper.make_opsetid("custom.domain", 1))
    with pytest.raises(InvalidProblemError, match="'b'"):
        problem_from_onnx(model)


def test_unknown_rank_names_the_tensor() -> None:
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", F32, None)],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    with pytest.raises(InvalidProblemError, match=r"'x'.*unknown shape"):
        problem_from_onnx(model)


def test_data_dependent_dimension_names_the_tensor() -> None:
    model = make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [
            helper.make_tensor_value_info("x", F32, [2, 3]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    with pytest.raises(InvalidProblemError, match=r"'y'.*unknown dimension"):
        problem_from_onnx(model)


@pytest.mark.parametrize(
    ("elem_type", "nbytes"),
    [
        (TensorProto.FLOAT, 4 * 15),
        (TensorProto.BFLOAT16, 2 * 15),
        (TensorProto.INT64, 8 * 15),
        (TensorProto.BOOL, 15),
        (TensorProto.INT4, 8),  # two to a byte, rounded up
    ],
)
def test_element_types_set_the_size(elem_type: int, nbytes: int) -> None:
    model = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", elem_type, [3, 5])],
        [helper.make_tensor_value_info("y", elem_type, None)],
    )
    gp = problem_from_onnx(model, alias_reshapes=False)
    assert [b.nbytes for b in gp.problem.buffers] == [nbytes]
    assert gp.unplanned == {"x": nbytes}


def test_string_tensors_cannot_be_planned() -> None:
    model = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.STRING, [3])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, None)],
    )
    with pytest.raises(InvalidProblemError, match=r"'x'.*string"):
        problem_from_onnx(model)


def test_constant_nodes_are_not_planned() -> None:
    nodes = [
        helper.make_node(
            "Constant", [], ["k"], value=helper.make_tensor("v", F32, [2, 2], [1.0] * 4)
        ),
        helper.make_node("Add", ["x", "k"], ["y"]),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [2, 2])],
        [helper.make_tensor_value_info("y", F32, None)],
    )
    gp = problem_from_onnx(model)
    assert [(b.id, b.start, b.end) for b in gp.problem.buffers] == [("y", 1, 2)]
    assert gp.unplanned_kinds["k"] == "constant" and gp.unplanned["k"] == 16


def test_nodes_out_of_order_are_sorted_and_dangling_inputs_rejected() -> None:
    model = small_graph()
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([nodes[2], nodes[0], nodes[3], nodes[1]])
    gp = problem_from_onnx(model, alias_reshapes=False)
    assert [b.id for b in gp.problem.buffers] == ["h", "r", "y", "z"]
    model.graph.node[0].input[0] = "ghost"
    with pytest.raises(InvalidProblemError, match="ghost"):
        problem_from_onnx(model)


def test_outer_scope_tensors_used_in_a_subgraph_count_as_used() -> None:
    branch_out = helper.make_tensor_value_info("b_out", F32, [2])
    then_graph = helper.make_graph(
        [helper.make_node("Relu", ["early"], ["b_out"])], "then", [], [branch_out]
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["early"], ["b_out"])], "else", [], [branch_out]
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["early"]),  # 0: used only inside the If's branches
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),  # 1
        helper.make_node("Greater", ["total", "zero"], ["cond"]),  # 2
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [2])],
        [helper.make_tensor_value_info("y", F32, [2])],
        [helper.make_tensor("zero", F32, [], [0.0])],
    )
    gp = problem_from_onnx(model)
    early = next(b for b in gp.problem.buffers if b.id == "early")
    assert (early.start, early.end) == (0, 4)
    check_consistent(gp)


def test_a_path_works_and_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "small.onnx"
    onnx.save(small_graph(), path)
    gp = problem_from_onnx(path)
    assert gp.name == "small"
    assert len(gp.problem) == 3  # the reshape shares its input's bytes
    with pytest.raises(InvalidProblemError, match="ModelProto or a path"):
        problem_from_onnx(42)  # type: ignore[arg-type]


def test_a_missing_or_foreign_file_is_a_problem_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidProblemError, match="cannot read"):
        problem_from_onnx(tmp_path / "absent.onnx")  # was FileNotFoundError
    csv = tmp_path / "plan.onnx"
    csv.write_text("id,lower,upper,size\na,0,1,4\n")
    with pytest.raises(InvalidProblemError, match="is not an ONNX model"):
        problem_from_onnx(csv)  # was protobuf's DecodeError
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(InvalidProblemError, match="is not an ONNX model: it has no graph"):
        problem_from_onnx(empty)  # parsed as a model with no graph: an empty problem, planned
    with pytest.raises(InvalidProblemError, match="no graph"):
        problem_from_onnx(onnx.ModelProto())


# -- models exported from torch ----------------------------------------------------------------
# torch is asked for by these tests alone: a module-level importorskip here used to skip every
# test of this file, the hand-built graphs above included, wherever torch was missing.


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


def export_onnx(model: Any, args: tuple[Any, ...], path: Path, **kwargs: object) -> None:
    import torch

    with contextlib.redirect_stdout(io.StringIO()):  # the exporter reports its progress
        torch.onnx.export(model, args, path, **kwargs)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the legacy exporter is the fast one
def test_tiny_torch_module_matches_the_torch_front_end(tmp_path: Path, torch: Any) -> None:
    from tensorarena.planning.torch_frontend import problem_from_exported

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.b = torch.nn.Linear(32, 16)

        def forward(self, x: Any) -> Any:
            return self.b(torch.relu(self.a(x))) + x

    net, x = Net(), torch.ones(4, 16)
    export_onnx(net, (x,), tmp_path / "net.onnx", dynamo=False)
    gp = problem_from_onnx(tmp_path / "net.onnx")
    reference = problem_from_exported(torch.export.export(net, (x,)))
    assert gp.lower_bound() == reference.lower_bound()
    assert gp.unplanned_bytes_of("parameter") == reference.unplanned_bytes_of("parameter")
    assert gp.unplanned_bytes_of("input") == x.numel() * 4
    check_consistent(gp)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # raised inside torch's ONNX exporter
@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_exported_transformer_is_in_the_ballpark_of_torch(
    name: str, tmp_path: Path, torch: Any
) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    from tensorarena.planning.models import build_model, model_problem

    model, (args, kwargs) = build_model(name, size="tiny")
    model.eval()
    path = tmp_path / f"{name}.onnx"
    export_onnx(model, args, path, kwargs=kwargs, dynamo=True)
    gp = problem_from_onnx(path)
    reference = model_problem(name, size="tiny")
    assert 0.5 <= gp.lower_bound() / reference.lower_bound() <= 2.0
    check_consistent(gp)


def test_the_plan_command_refuses_a_shape_a_static_export_contradicts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorarena.cli.main import main

    path = tmp_path / "static.onnx"
    onnx.save(small_graph(), str(path))
    assert main(["plan", str(path), "--input-shape", "x=3,4"]) == 2
    err = capsys.readouterr().err
    assert "input 'x' was exported with the static shape [2, 4]" in err and "[3, 4]" in err
    assert main(["plan", str(path), "--input-shape", "x=2,4", "--json"]) == 0
