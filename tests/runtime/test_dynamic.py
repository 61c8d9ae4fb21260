"""Dynamic shapes: a plan per shape (bounded cache), one plan for declared maximum sizes, and
growing dimensions served by the dynamic pool."""

from __future__ import annotations

from typing import Any

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.export import Dim  # noqa: E402

from tensorarena.errors import InvalidArgumentError  # noqa: E402
from tensorarena.planning.models import build_model  # noqa: E402
from tensorarena.runtime import PlannedProgram, ShapeNotCoveredError  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def gpt2() -> tuple[Any, Any]:
    """Tiny GPT-2 exported with a dynamic sequence length (2..48); batch stays 2."""
    model, (args, _) = build_model("gpt2")
    model.eval()
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=({1: Dim("seq", min=2, max=48)},),
                                 strict=False)
    return model, ep


def tokens(length: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(length))


def check(program: PlannedProgram, model: Any, x: torch.Tensor) -> None:
    with torch.no_grad():
        expected = model(x).to_tuple()
    torch.testing.assert_close(program(x).to_tuple(), expected)


def test_each_new_shape_is_planned_once_and_cached(gpt2: tuple[Any, Any]) -> None:
    model, ep = gpt2
    program = PlannedProgram.from_exported(ep, max_plans=2)
    for length, plans in ((16, 1), (8, 2), (16, 2), (8, 2), (24, 3), (16, 4)):
        check(program, model, tokens(length))
        assert program.plans_made == plans, length  # 16 was evicted by 24 (two shapes kept)
        assert program.report().shapes == {"input_ids.shape[1]": length}
    heights = {}
    for length in (8, 16, 24):
        program(tokens(length))
        heights[length] = program.report().planned_bytes
    assert heights[8] < heights[16] < heights[24]
    program.verify(tokens(24))


def test_shapes_outside_the_exported_range_are_refused_naming_the_dimension(
    gpt2: tuple[Any, Any],
) -> None:
    _, ep = gpt2
    program = PlannedProgram.from_exported(ep)
    with pytest.raises(ShapeNotCoveredError, match=r"input_ids\.shape\[1\] is 49.*2\.\.48") as info:
        program(tokens(49))
    assert info.value.dim == "input_ids.shape[1]"
    with pytest.raises(ShapeNotCoveredError, match=r"input_ids\.shape\[0\] is 3.*static"):
        program(tokens(16, batch=3))
    assert program.plans_made == 0


def test_one_plan_for_the_maximum_shape_serves_every_smaller_one(gpt2: tuple[Any, Any]) -> None:
    model, ep = gpt2
    program = PlannedProgram.from_exported(ep, max_shapes={"input_ids": (2, 32)})
    for length in (32, 5, 17, 2):
        check(program, model, tokens(length))
        assert "maximum" in program.report().planner
    assert program.plans_made == 1
    assert program.workspace.statistics().grows == 1
    program.verify(tokens(9))
    with pytest.raises(ShapeNotCoveredError, match=r"input_ids\.shape\[1\] is 33"):
        program(tokens(33))


def test_max_shapes_must_name_every_dynamic_dimension(gpt2: tuple[Any, Any]) -> None:
    _, ep = gpt2
    with pytest.raises(InvalidArgumentError, match=r"input_ids\.shape\[1\]"):
        PlannedProgram.from_exported(ep, max_shapes={})
    with pytest.raises(InvalidArgumentError, match="static"):
        PlannedProgram.from_exported(ep, max_shapes={"input_ids": (3, 32)})
    with pytest.raises(InvalidArgumentError, match=r"names no input \['input'\]"):
        # a misspelt input was ignored, and the program planned without the maximum
        PlannedProgram.from_exported(ep, max_shapes={"input_ids": (2, 32), "input": (2, 32)})


class Decoder(torch.nn.Module):
    """One attention step over a KV cache that grows by one position per call."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> Any:
        k = torch.cat([past_k, self.k(x)], dim=1)
        v = torch.cat([past_v, self.v(x)], dim=1)
        scores = (self.q(x) @ k.transpose(1, 2)) * 0.25
        return self.o(scores.softmax(-1) @ v), k, v


def test_a_growing_dimension_goes_to_the_dynamic_pool_and_never_replans() -> None:
    torch.manual_seed(0)
    model = Decoder().eval()
    cache = Dim("cache", min=1, max=1024)
    example = (torch.randn(2, 1, 16), torch.randn(2, 3, 16), torch.randn(2, 3, 16))
    ep = torch.export.export(model, example, dynamic_shapes=(None, {1: cache}, {1: cache}))
    pool = CountingMemory()
    # outputs made by torch: the pool serves the growing intermediates alone
    program = PlannedProgram.from_exported(ep, growing=["past_k.shape[1]"], pool=pool,
                                           outputs="fresh")
    k, v = example[1], example[2]
    for _ in range(6):
        x = torch.randn(2, 1, 16)
        with torch.no_grad():
            expected = model(x, k, v)
        before = pool.allocations
        got = program(x, k, v)
        torch.testing.assert_close(got, expected)
        # scores and softmax, sized per call (the scaling runs in place on the scores)
        assert pool.allocations - before == 2
        assert pool.live == {}  # and back in the pool when the call ends
        _, k, v = got
    assert program.plans_made == 1 and k.shape[1] == 9
    assert program.inplace_nodes == ("mul",)
    report = program.report()
    assert report.counts["pool"] == 2
    assert all(r == "size follows a growing dimension"
               for r in report.dynamic.values() if "output" not in r)
    program.verify(torch.randn(2, 1, 16), k, v)


def test_growing_must_name_a_dynamic_dimension(gpt2: tuple[Any, Any]) -> None:
    _, ep = gpt2
    with pytest.raises(InvalidArgumentError, match=r"no dynamic dimension 'input_ids\.shape\[0\]'"):
        PlannedProgram.from_exported(ep, growing=["input_ids.shape[0]"])
    with pytest.raises(InvalidArgumentError, match=r"list of dimension names"):
        # not the dimensions 'i', 'n', 'p', ...
        PlannedProgram.from_exported(ep, growing="input_ids.shape[1]")
