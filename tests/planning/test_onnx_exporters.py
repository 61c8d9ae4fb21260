"""ONNX front end on the models people have: both of torch's exporters, the model zoo, the CLI.

Models are exported here (tiny ones) by the legacy TorchScript exporter and the dynamo exporter,
with static and dynamic axes, in eval and training mode (attention, layer norm, dropout, batch
norm, convolutions); every one must plan, with its inputs pinned, and the plan must pass the
validator. The classic model-zoo families that ship (weights stripped) in onnx's own test data
must plan too. Hand-built graphs check each repair on its own.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import tensorarena.cli.main as cli_main  # noqa: E402
from tensorarena.errors import InvalidProblemError  # noqa: E402
from tensorarena.planning import onnx_frontend  # noqa: E402
from tensorarena.planning.onnx_frontend import problem_from_onnx  # noqa: E402
from tensorarena.planning.planners import plan  # noqa: E402
from tensorarena.planning.validate import validate  # noqa: E402

pytestmark = pytest.mark.onnx

F32 = TensorProto.FLOAT
IDS = (2, 16)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any],
           initializers: list[Any] = (), value_info: list[Any] = ()) -> Any:  # type: ignore[assignment]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers),
                              value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------------------------------------
# Each repair on a hand-built graph
# ---------------------------------------------------------------------------------------------


def test_shape_arithmetic_inference_cannot_follow_is_folded() -> None:
    # The legacy exporter's nn.MultiheadAttention: Slice(Shape(x), 0, Mod(7, 3)) - inference's
    # data propagation does not evaluate Mod, so the slice (and all after it) was unknown.
    const = {name: helper.make_tensor(name, TensorProto.INT64, [1], [v])
             for name, v in (("zero", 0), ("seven", 7), ("three", 3), ("rest", -1))}
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Mod", ["seven", "three"], ["end"]),
        helper.make_node("Slice", ["shape", "zero", "end"], ["head"]),
        helper.make_node("Concat", ["head", "rest"], ["target"], axis=0),
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Reshape", ["a", "target"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [6, 4])],
                   [helper.make_tensor_value_info("y", F32, None)], list(const.values()))
    gp = problem_from_onnx(model, alias_reshapes=False)
    assert [(b.id, b.nbytes) for b in gp.problem.buffers] == [("a", 96), ("r", 96), ("y", 96)]
    # What folded is a constant of the model, not a weight, and not planned.
    assert gp.unplanned_kinds["target"] == "constant" and gp.unplanned["target"] == 16


def test_stale_exporter_hints_are_dropped_when_inputs_are_pinned() -> None:
    # The dynamo exporter stores value_info such as '4*batch'; pinning the input must win.
    nodes = [helper.make_node("Concat", ["x", "x", "x", "x"], ["c"], axis=0),
             helper.make_node("Relu", ["c"], ["y"])]
    hint = helper.make_tensor_value_info("c", F32, ["4*batch", 3])
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, ["batch", 3])],
                   [helper.make_tensor_value_info("y", F32, ["4*batch", 3])],
                   value_info=[hint])
    with pytest.raises(InvalidProblemError, match="symbolic dimension 'batch'"):
        problem_from_onnx(model)
    gp = problem_from_onnx(model, input_shapes={"x": (5, 3)})
    assert [b.nbytes for b in gp.problem.buffers] == [4 * 5 * 3 * 4] * 2


def test_an_unused_optional_output_is_not_fatal_and_needs_no_bytes() -> None:
    # An old-opset training Dropout whose mask nobody reads and whose type nothing infers.
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Mystery", ["a"], ["b", "mask"], domain="custom.domain"),
             helper.make_node("Relu", ["a"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, [2, 2])],
                   [helper.make_tensor_value_info("y", F32, None)])
    model.opset_import.append(helper.make_opsetid("custom.domain", 1))
    gp = problem_from_onnx(model)
    assert [b.id for b in gp.problem.buffers] == ["a", "y"]


def _tied_head(weight_is_input: bool) -> Any:
    # The dynamo exporter's GPT-2 head: logits = h @ Transpose(wte), wte the embedding's weight.
    # Larger than what shape folding folds (FOLD_LIMIT elements), as real weights are.
    wte = helper.make_tensor("wte", F32, [64, 80], [0.5] * 64 * 80)
    bias = helper.make_tensor("bias", F32, [64], [0.5] * 64)
    nodes = [helper.make_node("Relu", ["x"], ["h"]),
             helper.make_node("Transpose", ["wte"], ["wte_t"], perm=[1, 0]),
             helper.make_node("Identity", ["wte_t"], ["head"]),
             helper.make_node("MatMul", ["h", "head"], ["logits"]),
             helper.make_node("RandomUniformLike", ["bias"], ["noise"]),  # never folded
             helper.make_node("Add", ["logits", "noise"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", F32, [4, 80])]
    if weight_is_input:
        inputs.append(helper.make_tensor_value_info("wte", F32, [64, 80]))
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", F32, None)], [wte, bias])


def test_what_only_constants_feed_is_folded_as_onnx_runtime_does() -> None:
    # The transposed weight was planned: a tied head's Transpose of the 147 MiB
    # embedding set GPT-2 base's dynamo-exported inference bound (246.9 MiB, torch's 99.7).
    gp = problem_from_onnx(_tied_head(weight_is_input=False))
    assert [b.id for b in gp.problem.buffers] == ["h", "logits", "noise", "y"]
    assert gp.unplanned_kinds["wte_t"] == "constant" and gp.unplanned["wte_t"] == 64 * 80 * 4
    assert gp.aliases["head"] == "wte_t"  # a view of a constant is that constant
    # An initializer that is also a graph input can be replaced at run time: nothing folds.
    gp = problem_from_onnx(_tied_head(weight_is_input=True))
    assert [b.id for b in gp.problem.buffers] == ["h", "wte_t", "logits", "noise", "y"]


def test_the_model_is_run_for_shapes_inference_cannot_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["a"]),
                    helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
                    helper.make_node("Relu", ["b"], ["y"])],
                   [helper.make_tensor_value_info("x", F32, [2, 3])],
                   [helper.make_tensor_value_info("y", F32, None)])
    expected = [(b.id, b.nbytes) for b in problem_from_onnx(model).problem.buffers]
    # Inference that gives nothing: every size must then come from running the model.
    monkeypatch.setattr(onnx_frontend, "infer_concrete_shapes",
                        lambda onnx, model, pinned: model)
    gp = problem_from_onnx(model)
    assert [(b.id, b.nbytes) for b in gp.problem.buffers] == expected


def test_a_size_that_follows_the_input_values_is_refused() -> None:
    # Reshape to a shape given as an input: two runs disagree (or fail), so no plan is made.
    model = _model([helper.make_node("Reshape", ["x", "s"], ["r"]),
                    helper.make_node("Relu", ["r"], ["y"])],
                   [helper.make_tensor_value_info("x", F32, [2, 3]),
                    helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("y", F32, None)])
    with pytest.raises(InvalidProblemError, match=r"'r'.*unknown dimension.*a Reshape node"):
        problem_from_onnx(model, alias_reshapes=False)


# ---------------------------------------------------------------------------------------------
# Models exported here by both exporters
# ---------------------------------------------------------------------------------------------


def _modules(torch: Any) -> dict[str, tuple[Any, Any, str, dict[int, str]]]:
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(50, 16)
            self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
            self.norm = nn.LayerNorm(16)
            self.dropout = nn.Dropout(0.1)
            self.head = nn.Linear(16, 5)

        def forward(self, ids: Any) -> Any:
            x = self.embed(ids)
            y, _ = self.attention(x, x, x)
            return self.head(self.norm(x + self.dropout(y)))

    class ConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.norm = nn.BatchNorm2d(4)
            self.dropout = nn.Dropout(0.2)
            self.head = nn.Linear(4, 5)

        def forward(self, x: Any) -> Any:
            x = torch.relu(self.norm(self.conv(x))).mean((2, 3))
            return self.head(self.dropout(x))

    torch.manual_seed(0)
    return {
        "attention": (Attention(), torch.randint(0, 50, IDS), "ids", {0: "batch", 1: "seq"}),
        "convnet": (ConvNet(), torch.randn(2, 3, 8, 8), "x", {0: "batch"}),
    }


CASES = [
    (name, exporter, mode, axes)
    for exporter in ("legacy", "dynamo")
    for name, mode, axes in (("attention", "eval", "static"), ("attention", "eval", "dynamic"),
                             ("attention", "train", "static"), ("attention", "train", "dynamic"),
                             ("convnet", "train", "dynamic"))
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], Path]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    folder = tmp_path_factory.mktemp("exported")
    modules = _modules(torch)
    paths: dict[tuple[str, ...], Path] = {}
    for name, exporter, mode, axes in CASES:
        module, example, input_name, dims = modules[name]
        module.train(mode == "train")
        path = folder / f"{name}_{exporter}_{mode}_{axes}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "legacy":
                training = (torch.onnx.TrainingMode.TRAINING if mode == "train"
                            else torch.onnx.TrainingMode.EVAL)
                torch.onnx.export(module, (example,), str(path), input_names=[input_name],
                                  dynamo=False, training=training,
                                  do_constant_folding=mode == "eval",
                                  dynamic_axes={input_name: dims} if axes == "dynamic" else None)
            else:
                shapes = None
                if axes == "dynamic":
                    shapes = ({axis: torch.export.Dim(label) for axis, label in dims.items()},)
                torch.onnx.export(module, (example,), str(path), input_names=[input_name],
                                  dynamo=True, dynamic_shapes=shapes, verbose=False)
        paths[(name, exporter, mode, axes)] = path
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_exported_models_plan(exported: dict[tuple[str, ...], Path],
                              case: tuple[str, str, str, str]) -> None:
    name = case[0]
    shapes = {"ids": IDS} if name == "attention" else {"x": (2, 3, 8, 8)}
    gp = problem_from_onnx(exported[case], input_shapes=shapes)
    result = plan(gp.problem, time_limit=5.0)
    validate(gp.problem, result)
    assert result.height >= gp.lower_bound() > 0
    assert not any(k == "input" for n, k in gp.unplanned_kinds.items() if n not in shapes)
    if case[3] == "static":  # pinning is a no-op on a static model, and the same plan
        static = problem_from_onnx(exported[case])
        assert static.lower_bound() == gp.lower_bound()


@pytest.mark.slow
def test_dynamic_and_static_exports_agree(exported: dict[tuple[str, ...], Path]) -> None:
    for exporter in ("legacy", "dynamo"):
        for mode in ("eval", "train"):
            pinned = [problem_from_onnx(exported[("attention", exporter, mode, axes)],
                                        input_shapes={"ids": IDS}).lower_bound()
                      for axes in ("static", "dynamic")]
            assert pinned[0] == pinned[1], (exporter, mode)


@pytest.mark.slow
def test_plan_an_onnx_model_from_the_command_line(exported: dict[tuple[str, ...], Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = exported[("attention", "dynamo", "eval", "dynamic")]
    assert cli_main.main(["plan", str(path), "--input-shape", "ids=2,16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["feasible"] and summary["height"] >= summary["lower_bound"] > 0
    assert cli_main.main(["plan", str(path)]) == 2  # unpinned: says which input to pin
    assert "symbolic dimension" in capsys.readouterr().err
    assert cli_main.main(["plan", str(path), "--input-shape", "nope=1"]) == 2
    assert "not a graph input" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The model zoo that ships with onnx
# ---------------------------------------------------------------------------------------------

ZOO = sorted((Path(onnx.__file__).parent / "backend" / "test" / "data" / "light").glob("*.onnx"))


@pytest.mark.skipif(not ZOO, reason="onnx's test data (the light model zoo) is not installed")
@pytest.mark.parametrize("path", ZOO, ids=[p.stem for p in ZOO])
def test_the_classic_model_zoo_plans(path: Path) -> None:
    gp = problem_from_onnx(path)
    result = plan(gp.problem, time_limit=5.0)
    validate(gp.problem, result)
    assert result.height >= gp.lower_bound() > 0
