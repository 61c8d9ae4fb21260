"""Backend: the options of torch.compile's programs are checked when the backend is made."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError, UnknownNameError  # noqa: E402
from tensorarena.runtime import Backend, PlannedProgram, Workspace  # noqa: E402
from tensorarena.runtime.options import ProgramOptions  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_backend_refuses_a_bad_option_when_made_not_inside_dynamo() -> None:
    # Otherwise each surfaced at the first compiled call, wrapped in BackendCompilerFailed.
    with pytest.raises(InvalidArgumentError, match=r"no option \['bogus'\]"):
        Backend(bogus=1)
    with pytest.raises(UnknownNameError, match="'nope'"):
        Backend(planner="nope")
    with pytest.raises(InvalidArgumentError, match="must be a Workspace, got str"):
        Backend(workspace="shared")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not both"):  # the resource was ignored
        Backend(workspace=Workspace(), resource=CountingMemory())
    with pytest.raises(InvalidArgumentError, match="contradicts the workspace"):
        Backend(workspace=Workspace(), concurrency="refuse")  # was silently ignored
    with pytest.raises(InvalidArgumentError, match="concurrency must be"):
        Backend(concurrency="sometimes")
    Backend(workspace=Workspace(concurrency="refuse"), concurrency="refuse")
    Backend(poison=True, unplaceable="dynamic", resource=CountingMemory())


def test_the_program_takes_the_options_record_and_no_other_option() -> None:
    # One list of options: PlannedProgram names only those of its graph and workspace and
    # passes the rest to ProgramOptions, which the backend also checks against.
    parameters = inspect.signature(PlannedProgram.__init__).parameters
    keywords = {name for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert keywords == {"name", "reference", "ranges", "workspace"}
    assert [p.kind for p in parameters.values()][-1] is inspect.Parameter.VAR_KEYWORD
    assert not keywords & {f.name for f in dataclasses.fields(ProgramOptions)}
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    with pytest.raises(TypeError, match="'bogus'"):
        PlannedProgram(gm, lambda graph, bindings: None, None, bogus=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_plans"):
        PlannedProgram(gm, lambda graph, bindings: None, None, max_plans=0)  # type: ignore[arg-type]
