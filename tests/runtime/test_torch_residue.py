"""Nothing of a deleted program stays (:mod:`tensorarena.runtime.torch_residue`): its objects
die with it, torch's process-wide caches are as they were, and a second build and deletion
leaves the process's Python memory where the first left it."""

from __future__ import annotations

import gc
import linecache
import os
import tracemalloc
import weakref
from typing import Any

import pytest

import tensorarena as ta
from tensorarena.runtime.torch_residue import FX_KEY, caches_as_they_were, forget_source

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.graph_module import _loader  # noqa: E402

from tensorarena.runtime import PlannedProgram, export_process  # noqa: E402


def _child_export() -> bool:
    """Whether an export can run in a child here (a thread left running forbids the fork)."""
    if not hasattr(os, "fork") or export_process.threads_in_the_way():
        pytest.skip("no export in a child here (no fork, or threads left running)")
    return True


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x))) + x


class _Stack(torch.nn.Sequential):
    """Twelve blocks: a graph whose FX source (~30 KiB a module) stood out of the noise."""

    def __init__(self) -> None:
        super().__init__(*(_Block() for _ in range(12)))


def _cycle(model: torch.nn.Module, x: torch.Tensor, **options: Any) -> list[weakref.ref[Any]]:
    """Build, call twice, verify, delete: weak references to what the program was made of."""
    program = PlannedProgram.from_module(model, (x,), **options)
    for _ in range(2):
        out = program(x)
    program.verify(x)
    given = program.compiler.given
    refs = [weakref.ref(o) for o in (program, program.compiler, program.compiler.gm,
                                     program.compiler.run, *(given[:1] if given else ()))]
    del program, out
    ta.empty_cache()
    return refs


def _fx_sources() -> int:
    return sum(1 for key in linecache.cache if str(key).startswith(FX_KEY))


@pytest.mark.parametrize(("reorder", "isolate"), [(True, False), (False, False), (True, True)])
def test_a_deleted_program_leaves_no_object_and_no_cache_entry(reorder: bool,
                                                              isolate: bool) -> None:
    if isolate:
        _child_export()
    model, x = _Block().eval(), torch.randn(8, 32)
    options = {"reorder": reorder, "isolate_export": isolate}
    _cycle(model, x, **options)  # imports and one-time registrations happen here
    gc.collect()
    fake, sources, lines = len(FakeTensorMode.cache), len(_loader.eval_cache), _fx_sources()
    refs = _cycle(model, x, **options)
    assert [r() for r in refs] == [None] * len(refs)
    assert len(FakeTensorMode.cache) == fake
    assert len(_loader.eval_cache) == sources
    assert _fx_sources() == lines


#: Where torch's fake-tensor machinery allocates what it keeps of every propagation (~25 KiB a
#: build of the stack below, in torch's own tables): torch's, not the program's.
TORCH_OWN = ("torch/_subclasses/", "torch/_prims_common/", "torch/_ops.py", "torch/_decomp/",
             "torch/utils/_stats.py")


def test_a_second_build_and_deletion_leaves_python_memory_where_the_first_did() -> None:
    """With the export in its child (the default; an export here leaves more of torch's own
    entries): what stays of a second cycle, outside torch's fake-tensor tables, is noise
    (~10-30 KiB of dict resizes and free lists; 74 KiB before, the FX sources)."""
    _child_export()
    model, x = _Stack().eval(), torch.randn(8, 32)
    _cycle(model, x, isolate_export=True)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        _cycle(model, x, isolate_export=True)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename")
                if not any(part in stat.traceback[0].filename for part in TORCH_OWN))
    assert grown < 48 * 1024, f"{grown} bytes stayed"


def test_the_caches_are_as_they_were_after_an_error_too() -> None:
    sources = len(_loader.eval_cache)
    with pytest.raises(RuntimeError), caches_as_they_were():
        module = torch.fx.symbolic_trace(_Block())
        assert len(_loader.eval_cache) > sources
        assert module(torch.randn(2, 32)).shape == (2, 32)
        raise RuntimeError("inside")
    assert len(_loader.eval_cache) == sources


def test_entries_there_before_stay() -> None:
    kept = torch.fx.symbolic_trace(_Block())
    key = type(kept).forward.__code__.co_filename
    with caches_as_they_were():
        torch.fx.symbolic_trace(_Block())
    assert key in _loader.eval_cache
    forget_source(kept)
    assert key not in _loader.eval_cache and key not in linecache.cache
    assert kept(torch.randn(2, 32)).shape == (2, 32)  # it still runs


@pytest.mark.parametrize("other", [None, 3, "x", torch.nn.Linear(2, 2)])
def test_forget_source_leaves_anything_else_alone(other: Any) -> None:
    sources = dict(_loader.eval_cache)
    forget_source(other)
    assert dict(_loader.eval_cache) == sources


def _graph_modules() -> list[Any]:
    gc.collect()
    return [o for o in gc.get_objects() if isinstance(o, torch.fx.GraphModule)]


@pytest.mark.parametrize("reorder", [False, "always", True])
def test_a_built_program_keeps_one_graph(reorder: Any) -> None:
    """The exported program's graph goes once the program is built (``reorder=True``: once its
    first recorded call has chosen the order); ``verify`` reads the export back from what the
    child sent, and the outputs are those of the program that kept both."""
    _child_export()
    model, x = _Stack().eval(), torch.randn(8, 32)
    before = _graph_modules()  # held, so that no new module reuses an id
    known = {id(g) for g in before}
    program = PlannedProgram.from_module(model, (x,), reorder=reorder, isolate_export=True)
    new = [g for g in _graph_modules() if id(g) not in known]
    if reorder is True:  # the traced order's graph stays for the first call's choice
        assert len(new) == 2 and program.compiler.given is not None
        del new  # it holds the traced order's module
        first = program(x)
        new = [g for g in _graph_modules() if id(g) not in known]
        assert program.compiler.given is None
    else:
        first = program(x)
        assert program.compiler.given is None
    assert new == [program.compiler.gm]
    assert len(program.compiler.gm.graph.nodes) > 12 * 4
    again = program(x)
    verified = program.verify(x)
    assert torch.equal(first, again) and torch.equal(verified, again)
    torch.testing.assert_close(again, model(x))
    del before


def test_the_module_a_program_runs_writes_its_source_only_when_read() -> None:
    """The program runs code of its own: the module over its graph writes FX's Python source
    (Llama 125M: 0.65 MiB held) only when something reads it, and it is then the graph's."""
    lazy = pytest.importorskip("torch.fx._lazy_graph_module")
    model, x = _Stack().eval(), torch.randn(8, 32)
    program = PlannedProgram.from_module(model, (x,))
    out = program(x)
    module = program.compiler.gm
    assert isinstance(module, lazy._LazyGraphModule) and module._needs_recompile()
    torch.testing.assert_close(out, model(x))
    assert "def forward" in module.code and not module._needs_recompile()  # read: written
    forget_source(module)


def test_a_deleted_training_step_leaves_no_cache_entry() -> None:
    """The training step's traced module (make_fx's) leaves its source in FX's caches no more
    than a program does (BERT-base's step: 190 KB of source a build before)."""
    from tensorarena.runtime import TrainingStep

    model, x = _Block().train(), torch.randn(8, 32)

    def cycle() -> weakref.ref[Any]:
        step = TrainingStep(model, (x,))
        loss, grads = step(x)
        assert set(grads) == {name for name, _ in model.named_parameters()}
        ref = weakref.ref(step.graph_module)
        del step, loss, grads
        ta.empty_cache()
        return ref

    cycle()
    gc.collect()
    sources, lines = len(_loader.eval_cache), _fx_sources()
    assert cycle()() is None
    assert len(_loader.eval_cache) == sources and _fx_sources() == lines
