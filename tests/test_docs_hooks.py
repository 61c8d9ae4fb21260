"""The site's build hooks (docs/hooks/), tested without MkDocs: the CLI page covers every command
and subcommand, and a plan drawn as a snapshot keeps half-open lifetimes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

HOOKS = Path(__file__).resolve().parents[1] / "docs" / "hooks"


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_cli_page_has_every_command_and_subcommand() -> None:
    from tensorarena.cli.main import BENCHMARKS, COMMANDS

    page = _hook("cli_reference").render()
    for name in COMMANDS:
        assert f"## `tensorarena {name}`" in page
        assert f"usage: tensorarena {name}" in page
    for name in BENCHMARKS:
        assert f"### `tensorarena bench {name}`" in page
    for action in ("record", "convert", "info"):  # trace's own subcommands
        assert f"### `tensorarena trace {action}`" in page
    assert "--node-limit NODES" in page


def test_the_marker_is_replaced_and_other_pages_left_alone() -> None:
    hook = _hook("cli_reference")
    assert hook.on_page_markdown("# x\n", page=None) == "# x\n"
    assert hook.MARKER not in hook.on_page_markdown(f"# x\n{hook.MARKER}\n", page=None)


def test_a_plan_drawn_as_a_snapshot_frees_before_it_allocates_at_the_same_step() -> None:
    pytest.importorskip("numpy")
    from tensorarena.planning import Buffer, Problem, plan
    from tensorarena.report import timeline_from_snapshot

    # b starts where a ends, so the plan may give it a's bytes: at step 2 the free must come
    # first, or the drawing would see two live blocks at one address.
    problem = Problem([Buffer("a", 0, 2, 4096), Buffer("b", 2, 4, 4096), Buffer("c", 1, 3, 64)])
    result = plan(problem)
    assert result.offset_of("a") == result.offset_of("b")
    snapshot = _hook("pictures")._snapshot_of_plan(result)
    actions = [(e["time_us"], e["action"], e["addr"]) for e in snapshot["device_traces"][0]]
    assert actions.index((2, "free_completed", result.offset_of("a"))) < actions.index(
        (2, "alloc", result.offset_of("b")))
    timeline = timeline_from_snapshot(snapshot)
    assert int(timeline.live.max()) == problem.lower_bound() == 4096 + 64
