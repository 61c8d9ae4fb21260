"""``bench/onnx_plans.py`` on tiny models, so the benchmark of issue 9's ONNX graphs cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx")

pytestmark = [pytest.mark.torch, pytest.mark.onnx]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "onnx_plans.py"


@pytest.fixture(scope="module")
def onnx_plans() -> ModuleType:
    spec = importlib.util.spec_from_file_location("onnx_plans", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the legacy exporter
def test_an_exported_tiny_model_is_planned_validated_and_within_the_bound(
    onnx_plans: ModuleType, tmp_path: Path
) -> None:
    path = onnx_plans.export_architecture("resnet", "legacy", tmp_path, size="tiny")
    assert path.is_file()
    from tensorarena.planning.onnx_frontend import problem_from_onnx

    problem = problem_from_onnx(path)
    rows = onnx_plans.plan_graph(problem, "resnet", "legacy", [0.5, 1.0])
    assert [r.time_limit for r in rows] == [0.5, 1.0]
    for row in rows:
        assert row.buffers == len(problem.problem.buffers) > 0
        assert row.lower_bound == problem.problem.lower_bound() > 0
        assert row.lower_bound <= row.height and row.ratio >= 1.0
        assert row.planner.startswith("auto:")


@pytest.mark.slow  # two dynamo exports, ~10 s
def test_json_accounts_for_every_export_planned_or_skipped_with_why(
    onnx_plans: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    # GPT-2 exports with the dynamo exporter, its training step too; the legacy one has no
    # aten::diff (transformers' masks) in torch 2.13: each case is a row or a skip with why.
    argv = ["--size", "tiny", "--only", "gpt2", "--no-zoo", "--time-limit", "1", "--training",
            "--json"]
    assert onnx_plans.main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    rows = {(r["model"], r["source"]): r for r in document["rows"]}
    skipped = {(s["model"], s["source"]) for s in document["skipped"]}
    assert set(rows) | skipped == {("gpt2", s) for s in
                                   ("dynamo", "legacy", "dynamo-train", "legacy-train")}
    assert not set(rows) & skipped and all(s["reason"] for s in document["skipped"])
    infer, train = rows["gpt2", "dynamo"], rows["gpt2", "dynamo-train"]
    # The step adds the backward pass and the gradients: more buffers, a higher peak.
    assert train["buffers"] > infer["buffers"] > 0
    assert train["lower_bound"] > infer["lower_bound"]
    assert all(r["ratio"] >= 1.0 for r in rows.values())
