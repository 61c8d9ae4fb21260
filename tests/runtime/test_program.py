"""PlannedProgram on small hand-written graphs: paths, outputs, shapes, threads, bad input."""

from __future__ import annotations

import gc
import threading

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")

import tensorarena  # noqa: E402
from tensorarena.errors import ConcurrentUseError  # noqa: E402
from tensorarena.planning.graph_problem import GraphProblem  # noqa: E402
from tensorarena.planning.problem import Buffer, Problem  # noqa: E402
from tensorarena.report import timeline_from_snapshot  # noqa: E402
from tensorarena.runtime import (  # noqa: E402
    ExportFailedError,
    PlannedProgram,
    PlanVerificationError,
    ShapeNotCoveredError,
    Workspace,
)

pytestmark = pytest.mark.torch


class Block(torch.nn.Module):
    """layer_norm (no out variant), linear and relu (out variants), a view, a sum."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.up(self.norm(x)).relu()
        y = self.down(h) + x
        return y, y.view(-1).sum()


def block_program(**options: object) -> tuple[PlannedProgram, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 8)
    return PlannedProgram.from_module(model, (x,), **options), model, x  # type: ignore[arg-type]


def in_block(tensor: torch.Tensor, memory: torch.Tensor) -> bool:
    start = memory.data_ptr()
    return start <= tensor.data_ptr() < start + max(memory.numel(), 1)


def test_outputs_equal_eager_and_each_node_path_is_reported() -> None:
    program, model, x = block_program(outputs="fresh")  # outputs made by torch: "dynamic"
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(program(x), expected)
    report = program.report()
    ops = {n.node: (n.path, n.op) for n in report.nodes}
    assert ops["layer_norm"][0] == "copy"  # composite op, no out variant
    assert ops["linear"][0] == "out" and ops["linear_1"][0] == "out"
    # linear's result dies at relu: relu runs in place on it; an output is never rewritten.
    assert program.inplace_nodes == ("relu",)
    assert ops["relu"] == ("alias", "aten.relu_.default")
    assert ops["view"][0] == "alias"
    assert ops["add"][0] == "dynamic" and ops["sum_1"][0] == "dynamic"  # graph outputs
    assert report.counts == {"out": 2, "copy": 1, "alias": 2, "dynamic": 2, "pool": 0, "other": 0}
    assert set(report.dynamic) == {"add", "sum_1"}
    assert report.planned_bytes == report.lower_bound  # three small buffers, planned exactly
    assert "copy" in str(report) and "graph output" in str(report)


def test_outputs_never_alias_the_arena_and_survive_the_next_call() -> None:
    program, _, x = block_program()
    first, total = program(x)
    kept = first.clone()
    memory = program.workspace.memory
    assert not in_block(first, memory) and not in_block(total, memory)
    program(torch.randn(4, 8))
    torch.testing.assert_close(first, kept)


def test_steady_state_takes_no_memory_from_the_resource() -> None:
    memory = CountingMemory()
    program, _, x = block_program(resource=memory, outputs="fresh")
    program(x)
    assert memory.allocations == 1  # the workspace's one block
    for _ in range(5):
        program(torch.randn(4, 8))
    assert memory.allocations == 1
    slots = program.compiler.last.generated.slots  # type: ignore[union-attr]
    assert slots and all(in_block(t, program.workspace.memory) for t in slots.values())


def test_handed_over_outputs_take_one_tail_while_the_caller_lets_them_go() -> None:
    memory = CountingMemory()
    program, model, x = block_program(resource=memory)  # outputs="handover", the default
    program(x)  # records the kernels' allocations and plans again: the code is made anew
    program(x)
    made = memory.allocations
    assert len(memory.live) == 2  # the workspace's block and the tail: nothing else is held
    for _ in range(5):
        program(torch.randn(4, 8))  # outputs dropped at once: the same tail again
    assert memory.allocations == made and len(memory.live) == 2
    kept = [program(torch.randn(4, 8)) for _ in range(3)]  # kept: a tail each
    assert len(memory.live) == 2 + 2  # the last call's tail is the one the code holds
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x))
    del kept
    gc.collect()
    assert len(memory.live) == 2  # the tails the caller let go of went back


def test_a_static_program_rejects_another_shape_naming_the_dimension() -> None:
    program, _, _ = block_program()
    with pytest.raises(ShapeNotCoveredError, match=r"x\.shape\[0\] is 5.*static size of 4") as info:
        program(torch.randn(5, 8))
    assert info.value.dim == "x.shape[0]" and info.value.got == 5 and info.value.expected == 4
    with pytest.raises(ShapeNotCoveredError, match="dtype"):
        program(torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(ShapeNotCoveredError, match="3 dimensions"):
        program(torch.randn(4, 8, 1))
    with pytest.raises(tensorarena.InvalidArgumentError):  # one tree, caught from the top level
        program(torch.randn(5, 8))


def test_runtime_errors_live_in_the_one_tree_and_keep_their_old_import_paths() -> None:
    from tensorarena.runtime import program as program_module
    from tensorarena.runtime import shapes

    assert tensorarena.ExportFailedError is ExportFailedError is program_module.ExportFailedError
    assert tensorarena.PlanVerificationError is PlanVerificationError
    assert tensorarena.ShapeNotCoveredError is ShapeNotCoveredError is shapes.ShapeNotCoveredError
    assert ShapeNotCoveredError.__module__ == "tensorarena.errors"


def test_verify_passes_a_correct_plan() -> None:
    program, _, x = block_program()
    program.verify(x)


def test_verify_refuses_inputs_the_program_refuses_before_running_the_reference() -> None:
    program, _, x = block_program()
    with pytest.raises(ShapeNotCoveredError, match="has dtype torch"):
        program.verify(x.double())  # the reference alone would fail on mixed dtypes
    with pytest.raises(tensorarena.InvalidArgumentError,
                       match=r"takes 1 positional argument \(x\).*got 0"):
        program.verify()  # the reference alone would raise torch's ValueError


def test_poisoning_catches_a_lifetime_computed_too_short() -> None:
    program, _, x = block_program(unplaceable="copy")
    honest = program.compiler.problem_of

    def too_short(bindings: object) -> GraphProblem:
        gp = honest(bindings)  # type: ignore[arg-type]
        # linear's result is read by relu (in place) and then by the second linear; claim it
        # dies where it is made.
        buffers = [
            Buffer(b.id, b.start, b.start + 1, b.nbytes, b.alignment) if b.id == "linear" else b
            for b in gp.problem.buffers
        ]
        return GraphProblem(Problem(buffers, name=gp.name), gp.unplanned, gp.unplanned_kinds,
                            gp.aliases, gp.outputs, gp.steps, gp.tensors)

    program.compiler.problem_of = too_short  # type: ignore[method-assign]
    with pytest.raises(PlanVerificationError, match="poisoned"):
        program.verify(x)


def test_two_threads_are_serialised_and_both_get_their_own_results() -> None:
    program, model, _ = block_program()
    inputs = [torch.randn(4, 8) for _ in range(8)]
    with torch.no_grad():
        expected = [model(x)[0] for x in inputs]
    errors: list[BaseException] = []

    def worker(indices: range) -> None:
        try:
            for _ in range(20):
                for i in indices:
                    torch.testing.assert_close(program(inputs[i])[0], expected[i])
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in (range(0, 4), range(4, 8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert program.workspace.statistics().calls == 2 * 20 * 4


def test_a_second_thread_is_refused_when_asked_to() -> None:
    program, _, x = block_program(concurrency="refuse")
    program(x)
    caught: list[BaseException] = []
    with program.workspace.use():  # as if a call were running in this thread

        def other() -> None:
            try:
                program(x)
            except BaseException as exc:
                caught.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        with pytest.raises(ConcurrentUseError, match="inside a call"):
            program(x)  # re-entering from the thread that holds it
    assert len(caught) == 1 and isinstance(caught[0], ConcurrentUseError)
    assert "another thread" in str(caught[0])


def test_programs_sharing_a_workspace_share_one_block() -> None:
    workspace = Workspace()
    a, _, x = block_program(workspace=workspace)
    b, _, _ = block_program(workspace=workspace)
    a(x)
    b(x)
    assert a.workspace is b.workspace and workspace.statistics().grows == 1


def test_the_constructors_refuse_a_module_where_a_program_or_graph_is_due() -> None:
    model = Block().eval()
    with pytest.raises(tensorarena.InvalidArgumentError, match="ExportedProgram, got Block"):
        PlannedProgram.from_exported(model)  # type: ignore[arg-type]
    with pytest.raises(tensorarena.InvalidArgumentError, match="GraphModule, got Block"):
        PlannedProgram.from_graph_module(model)  # type: ignore[arg-type]


def test_run_flat_refuses_a_list_of_the_wrong_length() -> None:
    program, _, x = block_program()
    with pytest.raises(tensorarena.InvalidArgumentError, match="placeholder values"):
        program.run_flat([x])  # the parameters come first
    with pytest.raises(tensorarena.InvalidArgumentError, match="got 0"):
        program.run_flat([])


def test_a_workspace_option_must_be_a_workspace_and_comes_without_a_resource() -> None:
    with pytest.raises(tensorarena.InvalidArgumentError, match="must be a Workspace, got str"):
        block_program(workspace="shared")
    with pytest.raises(tensorarena.InvalidArgumentError, match="not both"):
        # the resource would be silently ignored: the workspace has one
        block_program(workspace=Workspace(), resource=CountingMemory())


def test_a_bad_workspace_is_refused_before_the_order_is_searched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def searched(*args: object, **kwargs: object) -> None:
        raise AssertionError("reorder searched before the workspace was checked")

    monkeypatch.setattr("tensorarena.runtime.compiler.reordered", searched)
    with pytest.raises(tensorarena.InvalidArgumentError, match="must be a Workspace"):
        block_program(workspace="shared", reorder=True)


def test_concurrency_defaults_to_the_workspaces_and_may_not_contradict_it() -> None:
    # An explicit concurrency given with a workspace used to be dropped without a word: the
    # default "serialize" could not be told from one the caller wrote.
    assert block_program()[0].workspace.concurrency == "serialize"
    refusing = Workspace(concurrency="refuse")
    assert block_program(workspace=refusing)[0].workspace is refusing
    assert block_program(workspace=refusing, concurrency="refuse")[0].workspace is refusing
    for workspace, concurrency in ((Workspace(), "refuse"), (refusing, "serialize")):
        with pytest.raises(tensorarena.InvalidArgumentError, match="contradicts the workspace"):
            block_program(workspace=workspace, concurrency=concurrency)
    assert refusing.concurrency == "refuse" and refusing.statistics().calls == 0


# A custom op with a functional form and an out variant that refuses every call.
_lib = torch.library.Library("tensorarena_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.define("twice.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
_lib.define("thrice(Tensor x) -> Tensor")


def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _twice_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("this out variant never works")


_lib.impl("twice", _twice, "CompositeExplicitAutograd")
_lib.impl("twice.out", _twice_out, "CompositeExplicitAutograd")
_lib.impl("thrice", lambda x: x * 3, "CompositeExplicitAutograd")
torch.library.register_fake("tensorarena_test::twice")(lambda x: torch.empty_like(x))
torch.library.register_fake("tensorarena_test::thrice")(lambda x: torch.empty_like(x))


class Custom(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.ops.tensorarena_test.twice(x.sin())
        b = torch.ops.tensorarena_test.thrice(a.cos())
        return (a + b).sum()


def test_an_out_variant_that_fails_falls_back_to_copy_and_is_reported() -> None:
    x = torch.randn(3, 5)
    program = PlannedProgram.from_module(Custom(), (x,))
    torch.testing.assert_close(program(x), Custom()(x))
    paths = {n.node: n for n in program.report().nodes}
    assert paths["twice"].path == "copy" and "never works" in paths["twice"].reason
    assert paths["thrice"].path == "copy" and "no out variant" in paths["thrice"].reason
    torch.testing.assert_close(program(x), Custom()(x))  # the re-lowered code
    program.verify(x)


def test_ops_without_out_variant_can_stay_dynamic() -> None:
    x = torch.randn(3, 5)
    program = PlannedProgram.from_module(Custom(), (x,), unplaceable="dynamic")
    torch.testing.assert_close(program(x), Custom()(x))
    report = program.report()
    assert {n.node: n.path for n in report.nodes}["thrice"] == "dynamic"
    assert "thrice" in report.dynamic
    program.verify(x)


class DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_a_model_that_cannot_be_exported_says_what_to_try() -> None:
    with pytest.raises(ExportFailedError, match=r"What to try: torch\.compile") as info:
        PlannedProgram.from_module(DataDependent(), (torch.randn(3),))
    assert info.value.__cause__ is not None


def test_auto_keeps_short_lived_results_of_ops_without_out_variant_dynamic() -> None:
    program, model, x = block_program(unplaceable="auto")
    with torch.no_grad():
        torch.testing.assert_close(program(x), model(x))
    layer_norm = next(n for n in program.report().nodes if n.node == "layer_norm")
    assert layer_norm.path == "dynamic" and "short-lived" in layer_norm.reason
    program.verify(x)


def test_the_recorded_call_shows_every_slot_in_the_arena_and_torchs_own_blocks() -> None:
    # Without kernels' allocations planned, so that layer norm's own result is torch's.
    program, model, x = block_program(kernel_arena=False, outputs="fresh")
    program(x)
    out, snapshot = program.record_memory(x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
    arena = program.workspace.memory
    start, end = arena.data_ptr(), arena.data_ptr() + arena.numel()
    actions = snapshot["device_traces"][0]
    slots = [a for a in actions if a["action"] == "alloc" and a["frames"][0]["name"]
             .startswith("arena: ")]
    plan = program.compiler.last.plan  # type: ignore[union-attr]
    assert len(slots) == len(plan.problem)  # every planned buffer, at its offset
    offsets = sorted(a["addr"] - start for a in slots)
    assert offsets == sorted(plan.offsets)
    assert all(start <= a["addr"] and a["addr"] + a["size"] <= end for a in slots)
    times = [a["time_us"] for a in actions]
    assert times == sorted(times) and times[0] == 0
    sites = {a["frames"][0]["name"] for a in actions if a["action"] == "alloc"}
    assert "arena: aten.linear.default" in sites
    assert any(s.startswith("copy: ") for s in sites)  # layer_norm's own result, then copied
    assert any(s.startswith("dynamic: ") for s in sites)  # the output, fresh for the caller

    timeline = timeline_from_snapshot(snapshot, name="block")
    _, trace = program.trace_allocations(x)
    assert timeline.reserved is not None
    # Reserved = the arena + what torch held: the planned peak, as bench exec computes it.
    assert int(timeline.reserved.max()) == program.workspace.nbytes + trace.peak_bytes
    # What is live at the end is the outputs handed to the caller, nothing of the arena.
    assert int(timeline.live[-1]) == sum(t.untyped_storage().nbytes() for t in out)


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [("reorder", "sometimes", "reorder must be"), ("inplace", "no", "inplace must be"),
     ("poison", 1, "poison must be"), ("planner", "magic", "unknown planner"),
     ("time_limit", -1, "time_limit"), ("resource", tensorarena.HostMemory, "call it"),
     ("concurrency", "sometimes", "concurrency must be")],
)
def test_a_wrong_option_fails_where_it_is_written(option: str, value: object, match: str) -> None:
    # Truthy strings used to pass as True; planners, limits and resources failed at the first
    # call, after tracing.
    with pytest.raises(tensorarena.InvalidArgumentError, match=match):
        PlannedProgram.from_module(Block(), (torch.randn(2, 8),), **{option: value})


def test_a_numpy_input_is_named_as_such() -> None:
    x = torch.randn(2, 8)
    program = PlannedProgram.from_module(Block(), (x,))
    with pytest.raises(tensorarena.InvalidArgumentError, match=r"torch\.Tensor, got numpy"):
        program(x.numpy())
