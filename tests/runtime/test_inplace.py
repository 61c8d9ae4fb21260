"""The in-place rewrite: only where the input dies, is an intermediate and has the same layout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.runtime import PlannedProgram  # noqa: E402
from tensorarena.runtime.inplace import inplace_variant  # noqa: E402

pytestmark = pytest.mark.torch
aten = torch.ops.aten


def test_inplace_variants_come_from_the_schemas() -> None:
    assert inplace_variant(aten.relu.default) is aten.relu_.default
    assert inplace_variant(aten.add.Tensor) is aten.add_.Tensor
    assert inplace_variant(aten.mul.Scalar) is aten.mul_.Scalar
    assert inplace_variant(aten.pow.Tensor_Scalar) is aten.pow_.Scalar
    assert inplace_variant(aten.mm.default) is None  # no mm_
    assert inplace_variant(aten.view.default) is None  # a view
    assert inplace_variant(aten.relu_.default) is None  # already in place
    assert inplace_variant(aten.bernoulli.p) is None  # random: leave it as traced
    assert inplace_variant("not an op") is None


def program_of(module: torch.nn.Module, *args: torch.Tensor) -> PlannedProgram:
    program = PlannedProgram.from_module(module, args)
    torch.testing.assert_close(program(*args), module(*args))
    program.verify(*args)
    return program


class Chain(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ x.t()  # fresh
        h = h.relu()  # h dies here: in place
        h = h * 0.5 + 1.0  # both in place
        return h.sum()


def test_a_chain_of_elementwise_ops_runs_in_one_buffer() -> None:
    program = program_of(Chain(), torch.randn(6, 4))
    assert program.inplace_nodes == ("relu", "mul", "add")
    report = program.report()
    assert report.buffers == 2  # only the matmul's result is planned, and the output (its tail)


class Reused(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.nn.Parameter) -> torch.Tensor:
        h = x @ w
        a = h.relu()  # h is read again below: not in place
        b = a.sigmoid()  # a dies here: in place
        c = x.tanh()  # x is an input: never overwritten
        return (b + h).sum() + c.sum()


def test_inputs_and_buffers_read_later_are_never_overwritten() -> None:
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    program = program_of(Reused(), x, w)
    assert "relu" not in program.inplace_nodes and "tanh" not in program.inplace_nodes
    assert "sigmoid" in program.inplace_nodes
    assert torch.equal(x, x.clone())  # (inputs untouched: the comparison above used them)


class Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ x.t()  # (4, 4)
        s = h + h.t()  # the other argument views h transposed: in place would read written data
        e = (x @ x.t())[:1].expand(4, 4)  # an expanded view: overlapping elements
        return s.sum() + e.exp().sum()


def test_no_rewrite_where_another_argument_views_the_input_or_the_input_overlaps() -> None:
    program = program_of(Views(), torch.randn(4, 3))
    assert "add" not in program.inplace_nodes and "exp" not in program.inplace_nodes


class ToOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x @ x.t()
        return h.relu(), x.relu()  # returned: must stay out of the arena


def test_results_returned_by_the_graph_are_not_rewritten() -> None:
    program = program_of(ToOutput(), torch.randn(4, 3))
    assert program.inplace_nodes == ()


def test_the_rewrite_can_be_turned_off() -> None:
    x = torch.randn(6, 4)
    program = PlannedProgram.from_module(Chain(), (x,), inplace=False)
    torch.testing.assert_close(program(x), Chain()(x))
    # the matmul's, relu's, mul's and add's results, and the output
    assert program.inplace_nodes == () and program.report().buffers == 5
