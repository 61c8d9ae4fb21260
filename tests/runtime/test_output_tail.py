"""outputs="handover": outputs planned in a tail of the arena taken and handed over per call."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")

from torch.export import Dim  # noqa: E402

from tensorarena.errors import InvalidArgumentError  # noqa: E402
from tensorarena.planning.problem import Buffer, Plan, Problem  # noqa: E402
from tensorarena.planning.validate import validate  # noqa: E402
from tensorarena.runtime import PlannedProgram, kernel_arena  # noqa: E402
from tensorarena.runtime.output_tail import split_plan, tail_start  # noqa: E402

pytestmark = pytest.mark.torch


class Block(torch.nn.Module):
    """Two outputs: a planned result and a view of it; wide activations before them."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 64)
        self.down = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.down(self.up(x).relu()) + x
        return y, y.t()


def program_over(memory: CountingMemory | None = None, **options: Any,
                 ) -> tuple[PlannedProgram, torch.nn.Module]:
    torch.manual_seed(0)
    model = Block().eval()
    options.setdefault("kernel_arena", False)
    return PlannedProgram.from_module(model, (torch.randn(4, 8),), resource=memory,
                                      outputs="handover", **options), model


def eager(model: torch.nn.Module, x: torch.Tensor) -> Any:
    with torch.no_grad():
        return model(x)


# ----------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------


def naive_plan(problem: Problem) -> Plan:
    """Every buffer its own bytes: a planner whose height is the sum of the sizes."""
    offsets, at = [], 0
    for b in problem.buffers:
        offsets.append(at)
        at += -(-b.nbytes // b.alignment) * b.alignment
    return Plan(problem, tuple(offsets), planner="naive")


def lowest_plan(problem: Problem) -> Plan:
    from tensorarena.planning.planners import plan

    return plan(problem, "auto", time_limit=1.0)


def test_outputs_sit_above_every_other_buffer_and_an_early_one_shares_their_tail() -> None:
    # a (0..2) and b (1..3) make the peak; out is born at 3. a fits in out's bytes before it.
    problem = Problem([Buffer("a", 0, 2, 64), Buffer("b", 1, 3, 128), Buffer("out", 3, 5, 64),
                       Buffer("c", 3, 4, 32)])
    plan = split_plan(problem, {"out"}, lowest_plan)
    validate(problem, plan)
    offsets = plan.as_dict()
    start = tail_start(plan, {"out"})
    assert offsets["out"] == start and plan.height == start + 64  # the tail: out alone, packed
    assert offsets["a"] >= start  # moved: it dies before out is made
    assert plan.height == 128 + 64  # below the persistent part + out (a + b + out = 256)
    for b in problem.buffers:  # nothing crosses the tail's start
        assert offsets[b.id] + b.nbytes <= start or offsets[b.id] >= start


def test_early_buffers_fill_the_tail_up_to_the_size_of_the_outputs() -> None:
    problem = Problem([Buffer("a", 0, 1, 64), Buffer("b", 0, 1, 64), Buffer("out", 1, 2, 64)])
    plan = split_plan(problem, {"out"}, naive_plan)
    validate(problem, plan)
    assert tail_start(plan, {"out"}) == 64 and plan.height == 128  # a moved; b below
    assert split_plan(Problem([Buffer("x", 0, 1, 8)]), set(), naive_plan).height == 8


def test_several_outputs_are_packed_at_the_bottom_of_the_tail() -> None:
    problem = Problem([Buffer("o1", 2, 4, 100, 64), Buffer("t", 0, 3, 500, 64),
                       Buffer("o2", 3, 4, 30, 64)])
    plan = split_plan(problem, {"o1", "o2"}, lowest_plan)
    validate(problem, plan)
    start = tail_start(plan, {"o1", "o2"})
    assert plan.height - start == 128 + 30  # aligned sizes, nothing more kept by the caller


# ----------------------------------------------------------------------------------------------
# Calls
# ----------------------------------------------------------------------------------------------


def test_outputs_equal_eager_live_in_a_tail_and_torch_makes_no_output() -> None:
    memory = CountingMemory()
    program, model = program_over(memory)
    x = torch.randn(4, 8)
    y, yt = program(x)
    assert torch.equal(y, eager(model, x)[0]) and torch.equal(yt, eager(model, x)[1])
    assert memory.owns(y.data_ptr())
    assert yt.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    report = program.report()
    assert report.dynamic == {}  # nothing left out of the plan
    assert report.tail_bytes == 128  # y: 4 x 8 floats, aligned to 64
    assert program.workspace.nbytes == report.planned_bytes - report.tail_bytes
    assert y.untyped_storage().nbytes() == report.tail_bytes
    del y, yt
    _, trace = program.trace_allocations(x)
    assert "dynamic" not in trace.by_path


def test_outputs_kept_from_one_call_are_unchanged_by_the_next_and_freed_with_them() -> None:
    memory = CountingMemory()
    program, model = program_over(memory)
    x1, x2 = torch.randn(2, 4, 8)
    first = program(x1)
    copy = [t.clone() for t in first]
    second = program(x2)
    assert first[0].untyped_storage().data_ptr() != second[0].untyped_storage().data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(first, copy, strict=True))
    torch.testing.assert_close(second, eager(model, x2))
    live = len(memory.live)
    del first, copy
    gc.collect()
    assert len(memory.live) == live - 1  # the runtime kept no reference to the first tail
    del second  # the latest tail is idle now: the next call takes it again
    made = memory.allocations
    for _ in range(3):  # outputs dropped before the next call: one tail, taken again
        torch.testing.assert_close(program(x1), eager(model, x1))
    assert memory.allocations == made and len(memory.live) == live - 1


def test_a_tail_held_through_a_view_or_its_storage_alone_is_never_taken_again() -> None:
    memory = CountingMemory()
    program, _ = program_over(memory)
    x1, x2, x3 = torch.randn(3, 4, 8)
    first = program(x1)[0]
    expected = first.clone()
    row = first[1]  # a view only
    del first
    program(x2)
    assert torch.equal(row, expected[1])
    del row
    second = program(x3)[0]
    kept = second.clone()
    storage = second.untyped_storage()  # its storage object only
    del second
    program(x1)
    program(x2)
    again = torch.empty(0).set_(storage, 0, kept.shape, kept.stride())
    assert torch.equal(again, kept)


def test_poisoned_verification_passes_and_the_recorded_memory_runs() -> None:
    program, model = program_over()
    x = torch.randn(4, 8)
    program(x)
    torch.testing.assert_close(program.verify(x), eager(model, x))
    out, snapshot = program.record_memory(x)
    torch.testing.assert_close(out, eager(model, x))
    assert snapshot["segments"]


def test_two_threads_are_serialised_and_both_get_their_own_results() -> None:
    program, model = program_over()
    inputs = [torch.randn(4, 8) for _ in range(6)]
    expected = [eager(model, x)[0] for x in inputs]
    errors: list[BaseException] = []
    kept: list[tuple[int, torch.Tensor]] = []

    def worker(indices: range) -> None:
        try:
            for _ in range(10):
                for i in indices:
                    out = program(inputs[i])[0]
                    kept.append((i, out))
                    torch.testing.assert_close(out, expected[i])
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in (range(0, 3), range(3, 6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, out in kept:  # every output kept is still its call's
        torch.testing.assert_close(out, expected[i])


def test_dynamic_shapes_plan_each_shape_with_its_own_tail() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        ep = torch.export.export(model, (torch.randn(4, 8),),
                                 dynamic_shapes=({0: Dim("rows", min=2, max=32)},), strict=False)
    program = PlannedProgram.from_exported(ep, outputs="handover", kernel_arena=False)
    outputs = {}
    for rows in (4, 16, 4, 8):
        x = torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows))
        outputs[rows] = (x, program(x))
        torch.testing.assert_close(outputs[rows][1], eager(model, x))
        assert program.report().tail_bytes == -(-rows * 8 * 4 // 64) * 64
    for x, out in outputs.values():
        torch.testing.assert_close(out, eager(model, x))
    maximum = PlannedProgram.from_exported(ep, outputs="handover", kernel_arena=False,
                                           max_shapes={"x": (32, 8)})
    for rows in (32, 5):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(maximum(x), eager(model, x))
    maximum.verify(torch.randn(7, 8))


def test_a_bad_outputs_value_names_handover() -> None:
    with pytest.raises(InvalidArgumentError, match="'handover'"):
        PlannedProgram.from_module(Block(), (torch.randn(4, 8),), outputs="caller")


def test_kernel_allocations_served_with_a_tail_are_bit_identical() -> None:
    reason = kernel_arena.unavailable()
    if reason:
        pytest.skip(f"kernel arena shim unavailable: {reason}")

    class Normed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            c = self.conv(self.norm(x).transpose(1, 2)).transpose(1, 2)
            return self.norm(c + x)

    torch.manual_seed(0)
    model = Normed().eval()
    x = torch.randn(2, 8, 16)
    program = PlannedProgram.from_module(model, (x,), outputs="handover", kernel_arena="all")
    first = program(x)  # recorded, then planned again with the kernels' allocations
    kept = first.clone()
    for _ in range(2):
        out = program(torch.randn(2, 8, 16))
    assert torch.equal(first, kept)
    assert torch.equal(program(x), eager(model, x))
    assert program.report().kernel_arena.startswith("on")
    _, trace = program.trace_allocations(x)
    assert trace.planned_allocations == 0
    del out
    program.verify(x)


def test_a_pooled_output_is_bit_identical_to_eager() -> None:
    # adaptive_avg_pool2d to 1 x 1 is a mean in the op, a pooling kernel in its out variant.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1)).eval()
    x = torch.randn(2, 3, 9, 9)
    for outputs in ("handover", "arena"):
        program = PlannedProgram.from_module(model, (x,), outputs=outputs, kernel_arena=False)
        assert torch.equal(program(x), eager(model, x)), outputs
        reasons = program.report().reasons["copy"]
        assert "its out variant is another kernel: run, then copied into its slot" in reasons


def test_a_kernel_allocation_planned_in_the_tail_is_served_there_at_each_call() -> None:
    reason = kernel_arena.unavailable()
    if reason:
        pytest.skip(f"kernel arena shim unavailable: {reason}")
    import struct

    class Conv(torch.nn.Module):  # the convolution's temporaries make the peak; out comes after
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x)) + 1

    torch.manual_seed(0)
    model = Conv().eval()
    x = torch.randn(2, 16, 8)
    program = PlannedProgram.from_module(model, (x,), outputs="handover", kernel_arena="all")
    program(x)  # recorded, then planned again with the kernels' allocations
    current = program.compiler.last
    assert current is not None and current.scripts is not None
    start = tail_start(current.plan, current.graph.outputs)
    offsets = current.plan.as_dict()
    in_tail = [b for b in current.plan.problem.buffers if "#kernel" in b.id
               and offsets[b.id] >= start]
    assert in_tail  # it dies before the output is made: it shares the output's bytes
    inputs = [torch.randn(2, 16, 8) for _ in range(3)]
    kept = [(xi, program(xi)) for xi in inputs]
    for xi, out in kept:
        assert torch.equal(out, eager(model, xi))
    node, k = in_tail[0].id.split("#kernel")
    script = current.scripts.scripts[node]
    (entry,) = struct.unpack_from("<Q", script, 32 + 16 * int(k) + 8)
    arena = program.workspace.memory.data_ptr()
    tail = kept[-1][1].untyped_storage().data_ptr()  # the latest tail, still the code's
    assert (arena + entry) % 2**64 == tail + offsets[in_tail[0].id] - start
    served_before = program.report().kernel_served
    program(x)
    assert program.report().kernel_served > served_before
    _, trace = program.trace_allocations(x)
    assert trace.planned_allocations == 0
    program.verify(inputs[0])  # its code writes its own tail into the same scripts
    out = program(x)  # the program's code writes its own back before it runs
    assert torch.equal(out, eager(model, x))
    (entry,) = struct.unpack_from("<Q", script, 32 + 16 * int(k) + 8)
    tail = out.untyped_storage().data_ptr()
    assert (arena + entry) % 2**64 == tail + offsets[in_tail[0].id] - start


def test_an_allocation_served_in_a_slot_the_replan_moved_into_the_tail_moves_with_it() -> None:
    # Issue 22. BERT's third layer norm is recorded with its result served in its own slot
    # (KernelRecording.in_slots), in the persistent part; planned again with the kernels'
    # allocations, that slot moves into the tail. Its script entry must then follow the tail at
    # every call: left at the arena's address plus the slot's offset, the layer norm wrote past
    # the persistent arena (a segfault at BERT-base 2 x 256; a wrong output at this size).
    reason = kernel_arena.unavailable()
    if reason:
        pytest.skip(f"kernel arena shim unavailable: {reason}")
    transformers = pytest.importorskip("transformers")
    import struct

    torch.manual_seed(0)  # two layers of hidden size 64 and BERT's 4x wider feed-forward
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=256, vocab_size=128,
                                     max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    args = (torch.randint(0, 128, (2, 16)),)
    expected = eager(model, args[0]).to_tuple()
    program = PlannedProgram.from_module(model, args, outputs="handover")
    program(*args)  # recorded, then planned again with the kernels' allocations
    current = program.compiler.last
    assert current is not None and current.scripts is not None
    start = tail_start(current.plan, current.graph.outputs)
    planned = current.plan.as_dict()
    in_tail = {kernel: offset for kernel, offset in current.scripts.offsets.items()
               if kernel not in planned and offset >= start}
    assert in_tail  # served in a slot (no buffer of the plan's) that lies in the tail
    arena = program.workspace.memory.data_ptr()
    kept = []
    for _ in range(3):  # each call takes a new tail: the caller keeps every one
        out = program(*args)
        kept.append(out.to_tuple())
        tail = out.last_hidden_state.untyped_storage().data_ptr()
        for kernel, offset in in_tail.items():
            node, k = kernel.split("#kernel")
            (entry,) = struct.unpack_from("<Q", current.scripts.scripts[node], 32 + 16 * int(k) + 8)
            assert (arena + entry) % 2**64 == tail + offset - start, kernel
    for outputs in kept:
        assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))
    assert program.report().kernel_served > 0


def test_torch_compile_runs_forward_and_backward_graphs_with_handed_over_outputs() -> None:
    from tensorarena.runtime import Backend

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    backend = Backend(outputs="handover", kernel_arena=False)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    compiled(x).sum().backward()  # the forward's saved activations are outputs: in its tail
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(x).sum().backward()
    assert grads and all(torch.equal(grads[n], p.grad) for n, p in model.named_parameters())
    assert backend.programs and all(p.outputs == "handover" for p in backend.programs)


def test_an_intermediate_planned_in_the_tail_runs_there_before_the_output_takes_its_bytes() -> None:
    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 64)
            self.b = torch.nn.Linear(64, 64)
            self.c = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.b(torch.relu(self.a(x))))

    torch.manual_seed(0)
    model = Chain().eval()
    x = torch.randn(4, 8)
    program = PlannedProgram.from_module(model, (x,), outputs="handover", kernel_arena=False)
    program(x)
    current = program.compiler.last
    assert current is not None
    start = tail_start(current.plan, current.graph.outputs)
    offsets = current.plan.as_dict()
    moved = [b for b in current.plan.problem.buffers
             if b.id not in current.graph.outputs and offsets[b.id] >= start]
    assert moved  # the first layer's result dies before the output is made
    assert current.plan.height == 2 * 1024  # fresh outputs would come on top of 2 * 1024
    inputs = torch.randn(3, 4, 8)
    kept = [program(xi) for xi in inputs]
    for xi, out in zip(inputs, kept, strict=True):
        assert torch.equal(out, eager(model, xi))
    program.verify(x)
