"""torch.export in a child process (runtime.export_process): the same program as an export
made here, the model's own tensors, the same errors, and torch.export's imports left out."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _export_models import Block  # noqa: E402

from tensorarena.errors import (  # noqa: E402
    DataDependentError,
    ExportFailedError,
    ExportProcessError,
)
from tensorarena.runtime import PlannedProgram, export_process  # noqa: E402
from tensorarena.runtime.exporting import export_module  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the child needs os.fork")


@pytest.fixture(autouse=True)
def _no_thread_in_the_way() -> None:
    """A thread an earlier test left running forbids the child (and would make these tests
    check the export made here): said by name rather than failed on."""
    if export_process.threads_in_the_way():
        names = [t.name for t in export_process.threads_in_the_way()]
        pytest.skip(f"threads left running by earlier tests forbid a fork: {names}")


class Branchy(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        if x.sum() > 0:
            return x + 1
        return x - 1


def _isolated(model: Any, *args: Any, **options: Any) -> Any:
    return export_module(model, args, {}, isolated=True, strict=False, **options)


def test_the_program_read_back_holds_the_models_own_parameters_and_buffers() -> None:
    model = Block().eval()
    ep = _isolated(model, torch.randn(4, 8), dynamic_shapes=None)
    own = dict(model.named_parameters())
    own.update(model.named_buffers())
    assert ep.state_dict, "the program has parameters"
    for name, tensor in ep.state_dict.items():
        assert tensor is own[name], name
    assert ep.constants["scale"] is model.scale  # a non-persistent buffer: a constant
    lifted = [v for k, v in ep.constants.items() if k not in own]
    assert [float(v) for v in lifted] == [1.0]  # lifted out of the code: travels as saved


def test_a_planned_program_from_the_child_computes_what_eager_computes() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 8)
    program = PlannedProgram.from_module(model, (x,), isolate_export=True)
    assert torch.equal(program(x), model(x))
    model.linear.weight.data.mul_(2)  # the program reads the model's weights, not a copy
    assert torch.equal(program(x), model(x))


def test_training_mode_buffer_updates_reach_the_models_buffers() -> None:
    torch.manual_seed(0)
    model, twin = Block().train(), Block().train()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(4, 8)
    program = PlannedProgram.from_module(model, (x,), isolate_export=True)
    with torch.no_grad():
        expected = twin(x)
    assert torch.equal(program(x), expected)
    assert torch.equal(model.norm.running_mean, twin.norm.running_mean)
    assert not torch.equal(model.norm.running_mean, torch.zeros(8))


def test_dynamic_shapes_survive_the_trip() -> None:
    model = Block().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    program = PlannedProgram.from_module(model, (torch.randn(4, 8),), isolate_export=True,
                                         dynamic_shapes=({0: batch},))
    for n in (2, 4, 33):
        x = torch.randn(n, 8)
        assert torch.equal(program(x), model(x))


def test_a_static_program_comes_in_the_planners_form_a_dynamic_one_in_torchs(
        monkeypatch: Any) -> None:
    """torch.export.load left GPT-2's build 7 MiB of interpreter arenas (export_wire)."""
    read: list[str] = []
    unpack, load = export_process.unpack, torch.export.load
    monkeypatch.setattr(export_process, "unpack", lambda *a: read.append("wire") or unpack(*a))
    monkeypatch.setattr(torch.export, "load", lambda *a: read.append("torch") or load(*a))
    model = Block().eval()
    x = torch.randn(4, 8)
    assert torch.equal(_isolated(model, x, dynamic_shapes=None).module()(x), model(x))
    batch = torch.export.Dim("batch", min=2, max=64)
    assert torch.equal(_isolated(model, x, dynamic_shapes=({0: batch},)).module()(x), model(x))
    assert read == ["wire", "torch"]


def test_an_export_failure_in_the_child_raises_the_error_an_export_here_raises() -> None:
    x = torch.randn(3)
    with pytest.raises(DataDependentError) as here:
        export_module(Branchy(), (x,), {}, dynamic_shapes=None, strict=False, isolated=False)
    with pytest.raises(DataDependentError) as there:
        _isolated(Branchy(), x, dynamic_shapes=None)
    assert str(there.value) == str(here.value)
    assert there.value.where == here.value.where and "forward" in there.value.where
    cause = there.value.__cause__
    assert isinstance(cause, ExportProcessError)
    assert type(here.value.__cause__).__name__ in str(cause)


def test_a_child_that_dies_is_an_export_failure_naming_the_signal() -> None:
    def killed() -> Any:
        os.kill(os.getpid(), 9)

    with pytest.raises(ExportFailedError, match="signal 9") as failure:
        export_process.export_in_child(killed, Block())
    assert "isolate_export=False" in str(failure.value)


def test_a_program_that_cannot_be_saved_is_exported_here(monkeypatch: Any) -> None:
    def unsaveable(ep: Any, model: Any) -> bytes:
        raise TypeError("cannot save a custom class")

    monkeypatch.setattr(export_process, "_saved_without_weights", unsaveable)  # the child forks it
    model = Block().eval()
    x = torch.randn(4, 8)
    assert export_process.export_in_child(lambda: torch.export.export(model, (x,)), model) is None
    ep = _isolated(model, x, dynamic_shapes=None)  # exported here instead
    assert torch.equal(ep.module()(x), model(x))


def test_no_child_while_another_python_thread_runs() -> None:
    assert export_process.can_export_in_child()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not export_process.can_export_in_child()
    finally:
        stop.set()
        thread.join()
    assert export_process.can_export_in_child()


def test_the_default_export_leaves_torch_exports_tracer_out_of_this_process(
        tmp_path: Any) -> None:
    """Fails where the export runs in the process: the tracer imports aot_autograd."""
    script = textwrap.dedent("""
        import sys
        import torch
        from tensorarena.runtime import PlannedProgram

        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        x = torch.randn(2, 8)
        program = PlannedProgram.from_module(model, (x,))
        assert torch.equal(program(x), model(x))
        print("tracer" if "torch._functorch.aot_autograd" in sys.modules else "clean")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "clean"


def test_the_program_read_back_plans_as_an_export_here_plans() -> None:
    """Views and in-place writes are found by shared fake storages, which a saved program
    loses: without the views restored, GPT-2's views became buffers of their own."""
    pytest.importorskip("transformers")
    from tensorarena.planning.models import build_model
    from tensorarena.planning.torch_frontend import problem_from_exported

    model, (args, kwargs) = build_model("gpt2", size="tiny", batch=None, seq=None)
    model.eval()
    here = export_module(model, args, kwargs, dynamic_shapes=None, strict=False, isolated=False)
    there = export_module(model, args, kwargs, dynamic_shapes=None, strict=False, isolated=True)
    planned_here, planned_there = problem_from_exported(here), problem_from_exported(there)
    assert planned_there.aliases == planned_here.aliases
    assert planned_there.problem == planned_here.problem
    assert planned_there.unplanned == planned_here.unplanned


def test_a_model_whose_constants_are_its_own_buffers_comes_back_from_the_child() -> None:
    """Llama's rotary ``inv_freq`` is a non-persistent buffer: a constant of the program. Sent
    as a shape, torch.export.load could not read the program (and it was exported twice)."""
    pytest.importorskip("transformers")
    from tensorarena.planning.models import build_model

    model, (args, kwargs) = build_model("llama", size="tiny", batch=None, seq=None)
    model.eval()
    ep = export_process.export_in_child(
        lambda: export_module(model, args, kwargs, dynamic_shapes=None, strict=False,
                              isolated=False), model)
    assert ep is not None
    own = dict(model.named_buffers(remove_duplicate=False))
    shared = [name for name in ep.constants if name in own]
    assert shared and all(ep.constants[name] is own[name] for name in shared)
    with torch.no_grad():
        assert torch.equal(ep.module()(*args, **kwargs).logits, model(*args, **kwargs).logits)


def test_no_child_once_this_process_has_a_cuda_context(monkeypatch: Any) -> None:
    assert export_process.can_export_in_child()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not export_process.can_export_in_child()


def test_no_process_to_be_had_exports_here(monkeypatch: Any) -> None:
    def refused() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refused)
    model = Block().eval()
    x = torch.randn(4, 8)
    assert export_process.export_in_child(lambda: torch.export.export(model, (x,)), model) is None
    ep = _isolated(model, x, dynamic_shapes=None)
    assert torch.equal(ep.module()(x), model(x))


def test_a_child_the_system_reaps_itself_still_answers() -> None:
    """With SIGCHLD ignored the child is reaped at exit and waitpid finds no child."""
    import signal

    model = Block().eval()
    x = torch.randn(4, 8)
    before = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        ep = _isolated(model, x, dynamic_shapes=None)
    finally:
        signal.signal(signal.SIGCHLD, before)
    assert ep.state_dict["linear.weight"] is model.linear.weight
    assert torch.equal(ep.module()(x), model(x))


def test_tqdms_progress_monitor_is_stopped_for_the_fork_and_comes_back() -> None:
    tqdm = pytest.importorskip("tqdm")
    bar = tqdm.tqdm(total=1, disable=False, file=open(os.devnull, "w"))  # noqa: SIM115
    try:
        if tqdm.tqdm.monitor is None:
            pytest.skip("tqdm started no monitor (monitor_interval is 0)")
        assert export_process.can_export_in_child()
        model = Block().eval()
        x = torch.randn(4, 8)
        ep = export_process.export_in_child(lambda: torch.export.export(model, (x,)), model)
        assert ep is not None and torch.equal(ep.module()(x), model(x))
        assert not any(type(t).__name__ == "TMonitor" for t in threading.enumerate())
    finally:
        bar.close()
        bar.fp.close()
    again = tqdm.tqdm(total=1, file=open(os.devnull, "w"))  # noqa: SIM115
    assert tqdm.tqdm.monitor is not None and tqdm.tqdm.monitor.is_alive()
    again.close()
    again.fp.close()


@pytest.mark.parametrize("wrong", ["yes", 1, 0.0])
def test_isolate_export_takes_a_bool_or_none(wrong: Any) -> None:
    from tensorarena.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="isolate_export"):
        PlannedProgram.from_module(Block().eval(), (torch.randn(4, 8),), isolate_export=wrong)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_program_from_the_child_reads_back_again_the_same(dynamic: bool) -> None:
    """What a program that gave up the exported graph reads for ``verify``: the same nodes
    and names over the model's own tensors, in either form the child sends."""
    model = Block().eval()
    x = torch.randn(4, 8)
    shapes = ({0: torch.export.Dim("batch", min=2, max=64)},) if dynamic else None
    ep = _isolated(model, x, dynamic_shapes=shapes)
    reload = export_process.reloader(ep)
    assert reload is not None
    again = reload()
    assert again is not ep and again.graph is not ep.graph
    assert [n.name for n in again.graph.nodes] == [n.name for n in ep.graph.nodes]
    assert all(again.state_dict[k] is v for k, v in ep.state_dict.items())
    assert torch.equal(again.module()(x), model(x))


def test_a_program_exported_here_has_nothing_to_read_back() -> None:
    ep = export_module(Block().eval(), (torch.randn(4, 8),), {}, isolated=False, strict=False,
                       dynamic_shapes=None)
    assert export_process.reloader(ep) is None


def test_a_dynamic_program_from_the_child_verifies_at_new_shapes() -> None:
    model = Block().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    program = PlannedProgram.from_module(model, (torch.randn(4, 8),), isolate_export=True,
                                         dynamic_shapes=({0: batch},))
    assert program.compiler.given is None
    for n in (2, 33):
        x = torch.randn(n, 8)
        assert torch.equal(program.verify(x), model(x))


# ----------------------------------------------------------------------------------------------
# The classes of the program's inputs and outputs, registered here only where it holds one
# ----------------------------------------------------------------------------------------------


class Box:
    """A class torch's pytree does not know until registered (as transformers' caches)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


class Boxed(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return Box(x + 1)


def _register_box() -> None:
    from torch.utils import _pytree as pytree

    if Box not in pytree.SUPPORTED_NODES:
        pytree.register_pytree_node(Box, lambda box: ([box.tensor], None),
                                    lambda leaves, _: Box(leaves[0]),
                                    serialized_type_name=f"{__name__}.Box")


@pytest.fixture
def box_unregistered() -> Any:
    from torch.utils import _pytree as pytree

    yield
    if Box in pytree.SUPPORTED_NODES:
        pytree._deregister_pytree_node(Box)


def test_a_program_whose_output_holds_an_unknown_class_registers_it_here(
        box_unregistered: Any) -> None:
    x = torch.randn(3)
    calls: list[int] = []

    def export() -> Any:  # in the child: registered there for the export only
        _register_box()
        return torch.export.export(Boxed(), (x,))

    ep = export_process.export_in_child(export, Boxed(),
                                        register=lambda: calls.append(1) or _register_box())
    assert ep is not None and calls == [1]
    assert export_process.unregistered_nodes(ep) == set()
    out = ep.module()(x)
    assert isinstance(out, Box) and torch.equal(out.tensor, x + 1)


def test_a_program_of_known_classes_registers_nothing_here(box_unregistered: Any) -> None:
    x = torch.randn(2, 8)
    calls: list[int] = []
    model = Block()
    ep = export_process.export_in_child(lambda: torch.export.export(model, (x,)), model,
                                        register=lambda: calls.append(1))
    assert ep is not None and calls == []
    assert export_process.unregistered_nodes(ep) == set()


def test_unregistered_nodes_names_each_unknown_class_once(box_unregistered: Any) -> None:
    from torch.utils import _pytree as pytree

    _register_box()
    ep = torch.export.export(Boxed(), (torch.randn(3),))
    assert export_process.unregistered_nodes(ep) == set()
    pytree._deregister_pytree_node(Box)
    assert export_process.unregistered_nodes(ep) == {Box}
