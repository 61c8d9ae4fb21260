"""Backend: the options of torch.compile's programs are checked when the backend is made."""

from __future__ import annotations

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError, UnknownPlannerError  # noqa: E402
from tensorarena.runtime import Backend, Workspace  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_backend_refuses_a_bad_option_when_made_not_inside_dynamo() -> None:
    # Otherwise each surfaced at the first compiled call, wrapped in BackendCompilerFailed.
    with pytest.raises(InvalidArgumentError, match=r"no option \['bogus'\]"):
        Backend(bogus=1)
    with pytest.raises(UnknownPlannerError, match="'nope'"):
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
