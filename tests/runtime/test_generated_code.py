"""The generated code keeps its source compressed (:mod:`tensorarena.runtime.generated_code`)."""

from __future__ import annotations

import pytest

from tensorarena.runtime.generated_code import Generated, packed

torch = pytest.importorskip("torch")


def test_the_source_comes_back_as_it_was_and_smaller() -> None:
    source = "".join(f"    v{k} = torch.ops.aten.mm.out(v{k - 1}, w, out=slot{k})\n"
                     for k in range(1, 400))
    code = Generated(run=lambda inputs: None, packed_source=packed(source), slots={}, failed={})
    assert code.source == source
    assert len(code.packed_source) < len(source) // 4
    assert Generated(run=lambda inputs: None, packed_source=packed(""), slots={},
                     failed={}).source == ""


def test_a_program_shows_the_source_it_runs() -> None:
    from tensorarena.runtime import PlannedProgram

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    x = torch.randn(4, 8)
    program = PlannedProgram.from_module(model, (x,))
    assert program.source == ""  # nothing generated before the first call
    program(x)
    assert "def run(inputs" in program.source
    compile(program.source, "<test>", "exec")  # whole, as generated
