"""A call's arguments against the ones a program was built with: never a silent wrong answer.

Non-tensor arguments are baked into the graph (exported again or refused when they change),
tensors must keep their dtype and device, a tensor that requires grad is warned about once, and
a call laid out otherwise is refused saying what the program takes.
"""

from __future__ import annotations

import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch.export import Dim  # noqa: E402

from tensorarena.errors import InvalidArgumentError, NoGradWarning  # noqa: E402
from tensorarena.runtime import PlannedProgram, ShapeNotCoveredError, TrainingStep  # noqa: E402

pytestmark = pytest.mark.torch


class Scaled(torch.nn.Module):
    """``n`` picks a branch and a factor: a graph built with one ``n`` is wrong for another."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        y = self.lin(x).relu() * n
        return y + 1 if n > 4 else y - 1


class Options(torch.nn.Module):
    """Every kind of value a graph bakes in: float, bool, str, None, nested in containers."""

    def forward(self, x: torch.Tensor, scale: float, flag: bool = True, mode: str = "add",
                bias: float | None = None, pair: tuple = (1, (2.0, "b"))) -> torch.Tensor:
        y = x * scale
        if flag:
            y = y + 1
        y = y + 2 if mode == "add" else y * 2
        if bias is not None:
            y = y + bias
        return y + pair[0] + pair[1][0] + len(pair[1][1])


EXAMPLE = {"flag": True, "mode": "add", "bias": None, "pair": (1, (2.0, "b"))}


def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
           **options: object) -> torch.export.ExportedProgram:
    with torch.no_grad():
        return torch.export.export(model, args, kwargs or {}, strict=False, **options)


@pytest.fixture(scope="module")
def options_program() -> PlannedProgram:
    x = torch.randn(2, 4)
    return PlannedProgram.from_exported(export(Options(), (x, 0.5), EXAMPLE))


# ----------------------------------------------------------------------------------------------
# Non-tensor values
# ----------------------------------------------------------------------------------------------


def test_from_module_exports_again_for_another_int_and_keeps_both() -> None:
    torch.manual_seed(0)
    model = Scaled().eval()
    x = torch.randn(3, 4)
    program = PlannedProgram.from_module(model, (x, 3))
    with torch.no_grad():
        three, five = model(x, 3), model(x, 5)
    assert not torch.equal(three, five)
    torch.testing.assert_close(program(x, 3), three, rtol=0, atol=0)
    assert "aten.sub.Tensor" in {n.op for n in program.report().nodes}
    torch.testing.assert_close(program(x, 5), five, rtol=0, atol=0)  # not the n=3 result
    five_program = program.program_for(x, 5)
    assert five_program is not program and program.program_for(x, 3) is program
    # report and source describe the latest call: the graph exported for n=5
    ops = {n.op for n in program.report().nodes}
    assert "aten.add.Tensor" in ops and "aten.sub.Tensor" not in ops
    assert program.source == five_program.source
    torch.testing.assert_close(program(x, 5), five, rtol=0, atol=0)
    assert program.program_for(x, 5) is five_program  # kept, not exported again
    assert five_program.workspace is program.workspace  # one block, one lock
    torch.testing.assert_close(program(x, 3), three, rtol=0, atol=0)
    assert "exported_again=1" in repr(program)
    torch.testing.assert_close(program.verify(x, 5), five, rtol=0, atol=0)


def test_from_module_keeps_at_most_max_plans_sets_of_values() -> None:
    model = Scaled().eval()
    x = torch.randn(3, 4)
    program = PlannedProgram.from_module(model, (x, 3), max_plans=1)
    program(x, 5)
    five = program.program_for(x, 5)
    program(x, 6)
    assert "exported_again=1" in repr(program)
    assert program.program_for(x, 5) is not five  # evicted, so exported again


def test_from_module_serves_a_value_of_another_type_with_its_own_graph() -> None:
    """1, 1.0 and True are equal in Python, not to the graph: an int tensor times 1.0 is
    a float tensor."""
    model = Scaled().eval()
    model.lin = torch.nn.Identity()  # type: ignore[assignment]
    x = torch.arange(12).reshape(3, 4)
    program = PlannedProgram.from_module(model, (x, 1))
    assert program(x, 1).dtype == torch.int64
    assert program(x, 1.0).dtype == torch.float32
    assert program.program_for(x, 1.0) is not program


def test_from_exported_refuses_another_int_naming_it_as_its_module_does() -> None:
    model = Scaled().eval()
    x = torch.randn(3, 4)
    ep = export(model, (x, 3))
    program = PlannedProgram.from_exported(ep)
    program(x, 3)
    with pytest.raises(Exception, match="Guard failed"):  # torch's own module
        ep.module()(x, 5)
    with pytest.raises(ShapeNotCoveredError, match=r"argument 'n' is 5; .* built with n=3") as err:
        program(x, 5)
    assert (err.value.dim, err.value.got, err.value.expected) == ("n", 5, 3)
    assert "from_module" in str(err.value) and "Dim.DYNAMIC" in str(err.value)
    for other in (3.0, True, torch.tensor(3), None, "3"):
        with pytest.raises(ShapeNotCoveredError, match="argument 'n'"):
            program(x, other)
    with pytest.raises(ShapeNotCoveredError, match="argument 'n'"):
        program.verify(x, 5)  # before the reference runs
    state = [ep.state_dict["lin.weight"], ep.state_dict["lin.bias"]]
    program.run_flat([*state, x, 3])
    with pytest.raises(ShapeNotCoveredError, match="argument 'n' is 5"):
        program.run_flat([*state, x, 5])
    with pytest.raises(ShapeNotCoveredError, match="argument 'n'"):
        program.program_for(x, 5)


@pytest.mark.parametrize(
    ("changed", "label", "got", "expected"),
    [
        ({"scale": 0.25}, "scale", 0.25, 0.5),
        ({"flag": False}, "flag", False, True),
        ({"mode": "mul"}, "mode", "mul", "add"),
        ({"bias": 0.0}, "bias", 0.0, None),
        ({"pair": (2, (2.0, "b"))}, "pair[0]", 2, 1),
        ({"pair": (1, (2.5, "b"))}, "pair[1][0]", 2.5, 2.0),
        ({"pair": (1, (2.0, "bb"))}, "pair[1][1]", "bb", "b"),
    ],
)
def test_every_kind_of_baked_value_is_guarded_naming_its_place(
    options_program: PlannedProgram, changed: dict, label: str, got: object, expected: object,
) -> None:
    x = torch.randn(2, 4)
    call = {"scale": 0.5, **EXAMPLE, **changed}
    scale = call.pop("scale")
    with pytest.raises(ShapeNotCoveredError) as err:
        options_program(x, scale, **call)
    assert (err.value.dim, err.value.got, err.value.expected) == (label, got, expected)
    assert f"argument {label!r}" in str(err.value)


def test_equal_values_pass_whatever_object_carries_them(options_program: PlannedProgram) -> None:
    x = torch.randn(2, 4)
    mode = "".join(["ad", "d"])  # equal, not the same object
    got = options_program(x, 1 / 2, flag=True, mode=mode, bias=None,
                          pair=(int("1"), (float("2"), "".join("b"))))
    with torch.no_grad():
        torch.testing.assert_close(got, Options()(x, 0.5, **EXAMPLE), rtol=0, atol=0)


def test_a_nan_built_with_matches_any_nan() -> None:
    x = torch.randn(2, 4)
    program = PlannedProgram.from_exported(export(Options(), (x, math.nan), EXAMPLE))
    assert torch.isnan(program(x, float("nan"), **EXAMPLE)).all()
    with pytest.raises(ShapeNotCoveredError, match="argument 'scale'"):
        program(x, 0.5, **EXAMPLE)


class Sized(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n + torch.ones(n).cumsum(0)[-1]


def test_an_int_exported_dynamic_is_a_size_planned_per_value_and_must_be_an_int() -> None:
    model = Sized()
    x = torch.randn(3, 4)
    program = PlannedProgram.from_exported(export(model, (x, 5), dynamic_shapes=(None,
                                                                                 Dim.DYNAMIC)))
    for n in (5, 7, 5):
        torch.testing.assert_close(program(x, n), model(x, n), rtol=0, atol=0)
    assert program.plans_made == 2
    for wrong in (7.5, True):
        with pytest.raises(InvalidArgumentError, match=r"'n' must be an int"):
            program(x, wrong)
    with pytest.raises(ShapeNotCoveredError, match=r"n is 1, outside .* \(>= 2\)"):
        program(x, 1)  # export's range for a dynamic int starts at 2


def test_a_training_step_refuses_another_value_than_it_was_traced_with() -> None:
    model = Scaled()
    x = torch.randn(3, 4)
    step = TrainingStep(model, (x, 3), outputs="fresh", reorder=False)
    step(x, 3)
    with pytest.raises(ShapeNotCoveredError, match=r"argument 'n' is 5; .* n=3.*TrainingStep"):
        step(x, 5)


# ----------------------------------------------------------------------------------------------
# Tensors: dtype, device, requires_grad
# ----------------------------------------------------------------------------------------------


def test_a_tensor_on_another_device_is_refused_naming_it() -> None:
    x = torch.randn(3, 4)
    program = PlannedProgram.from_exported(export(Scaled().eval(), (x, 3)))
    with pytest.raises(ShapeNotCoveredError, match=r"'x' is on meta .*built for cpu") as err:
        program(x.to("meta"), 3)
    assert (err.value.dim, err.value.got, err.value.expected) == (
        "x", torch.device("meta"), torch.device("cpu"))
    with pytest.raises(ShapeNotCoveredError, match=r"'x' has dtype torch\.float64"):
        program(x.double(), 3)


def test_a_dynamic_input_on_another_device_is_refused_too() -> None:
    x = torch.randn(3, 4)
    program = PlannedProgram.from_exported(
        export(Scaled().eval(), (x, 3), dynamic_shapes=({0: Dim("rows")}, None)))
    program(torch.randn(5, 4), 3)
    with pytest.raises(ShapeNotCoveredError, match="'x' is on meta"):
        program(torch.randn(5, 4, device="meta"), 3)


def test_an_input_that_requires_grad_is_warned_about_once() -> None:
    model = Scaled().eval()
    x = torch.randn(3, 4)
    program = PlannedProgram.from_exported(export(model, (x, 3)))
    program(x, 3)  # no warning: filterwarnings=error would raise it
    leaf = x.clone().requires_grad_()
    with pytest.warns(NoGradWarning, match=r"'x' requires grad.*TrainingStep.*tensorarena"):
        out = program(leaf, 3)
    assert out.grad_fn is None and not out.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program(leaf, 3)  # said once per program


# ----------------------------------------------------------------------------------------------
# The layout of a call
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "got"),
    [
        ((), EXAMPLE, "got 1 positional argument "),
        ((0.5, 1), EXAMPLE, "got 3 positional arguments"),
        ((0.5,), {**EXAMPLE, "extra": 1}, "got the unknown keyword argument extra"),
        ((0.5,), {"flag": True, "mode": "add"}, "got no keyword arguments bias, pair"),
    ],
)
def test_a_call_laid_out_otherwise_says_what_the_program_takes(
    options_program: PlannedProgram, args: tuple, kwargs: dict, got: str,
) -> None:
    x = torch.randn(2, 4)
    with pytest.raises(InvalidArgumentError) as err:
        options_program(x, *args, **kwargs)
    text = str(err.value)
    assert text.startswith("the program takes 2 positional arguments (x, scale) and the keyword "
                           "arguments flag, mode, bias, pair; ")
    assert got in text and "TreeSpec" not in text


def test_a_container_of_another_shape_is_refused_naming_the_argument(
    options_program: PlannedProgram,
) -> None:
    x = torch.randn(2, 4)
    with pytest.raises(InvalidArgumentError,
                       match=r"'pair' is laid out as \(\*, \*\); .* \(\*, \(\*, \*\)\)"):
        options_program(x, 0.5, **{**EXAMPLE, "pair": (1, 2.0)})


def test_keywords_may_come_in_any_order(options_program: PlannedProgram) -> None:
    x = torch.randn(2, 4)
    reordered = dict(reversed(EXAMPLE.items()))
    torch.testing.assert_close(options_program(x, 0.5, **reordered),
                               options_program(x, 0.5, **EXAMPLE), rtol=0, atol=0)
