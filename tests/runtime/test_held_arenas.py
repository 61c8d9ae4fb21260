"""outputs="arena": outputs planned in the arena and handed over as views the caller holds."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
from _resources import CountingMemory

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError  # noqa: E402
from tensorarena.runtime import PlannedProgram, TrainingStep  # noqa: E402

pytestmark = pytest.mark.torch


class Block(torch.nn.Module):
    """Two outputs: one a planned result, one a view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.down(self.up(x).relu()) + x
        return y, y.t()


def program_over(memory: CountingMemory) -> tuple[PlannedProgram, torch.nn.Module]:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(4, 8)
    # Without kernels' allocations planned: with them, the first call of a shape (recorded) runs
    # in a block of the plan without them, one more block made (test_kernel_arena.py).
    return PlannedProgram.from_module(model, (x,), resource=memory, outputs="arena",
                                      kernel_arena=False), model


def eager(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model(x)  # type: ignore[no-any-return]


def test_outputs_equal_eager_and_live_in_an_arena_block_torch_never_allocates() -> None:
    memory = CountingMemory()
    program, model, = program_over(memory)
    x = torch.randn(4, 8)
    y, yt = program(x)
    torch.testing.assert_close((y, yt), eager(model, x))
    assert memory.owns(y.data_ptr()) and memory.owns(yt.data_ptr())
    assert yt.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert program.report().dynamic == {}  # nothing left out of the plan
    del y, yt
    _, trace = program.trace_allocations(x)
    assert "dynamic" not in trace.by_path  # torch made no output


def test_a_call_never_overwrites_the_outputs_of_an_earlier_one_while_any_view_lives() -> None:
    memory = CountingMemory()
    program, model = program_over(memory)
    x1, x2, x3 = torch.randn(3, 4, 8)
    first = program(x1)[0]  # the output itself is kept, its transpose dropped
    expected = eager(model, x1)[0]
    second = program(x2)[0]
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    torch.testing.assert_close(first, expected)
    row = first[1]  # then only a view of it
    del first
    gc.collect()
    third = program(x3)[0]
    torch.testing.assert_close(row, expected[1])
    torch.testing.assert_close(second, eager(model, x2)[0])
    torch.testing.assert_close(third, eager(model, x3)[0])
    assert memory.allocations == 3  # every block was held when its call came


def test_blocks_are_taken_again_once_their_outputs_are_dropped_and_extras_released() -> None:
    memory = CountingMemory()
    program, model = program_over(memory)
    x = torch.randn(4, 8)
    outputs = program(x)
    for _ in range(6):  # a loop that keeps each step's outputs until the next returns
        outputs = program(x)
    assert memory.allocations == 2  # two blocks, in turn
    kept = [program(x) for _ in range(3)]
    assert len(memory.live) == 4
    del kept, outputs
    torch.testing.assert_close(program(x), eager(model, x))
    assert len(memory.live) == 1  # idle blocks beyond the one taken went back
    assert memory.allocations == 4


def test_verify_and_the_recorded_call_run_in_blocks_of_their_own() -> None:
    memory = CountingMemory()
    program, model = program_over(memory)
    x = torch.randn(4, 8)
    program(x)
    torch.testing.assert_close(program.verify(x), eager(model, x))
    out, snapshot = program.record_memory(x)
    torch.testing.assert_close(out, eager(model, x))
    assert snapshot["segments"]


def test_outputs_takes_fresh_or_arena() -> None:
    with pytest.raises(InvalidArgumentError, match="outputs must be"):
        program_over_bad = PlannedProgram.from_module(Block(), (torch.randn(4, 8),),
                                                      outputs="caller")
        del program_over_bad


def test_a_training_steps_gradients_reuse_the_bytes_of_its_activations() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 8)).train()
    x = torch.randn(16, 8)
    memory = CountingMemory()
    step = TrainingStep(model, (x,), resource=memory)
    assert step.program.outputs == "arena"  # the training default
    _, grads = step(x)
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad)
        assert memory.owns(grads[name].data_ptr())
    report = step.program.report()
    fresh = TrainingStep(model, (x,), outputs="fresh")
    fresh(x)
    # One arena for activations and gradients, smaller than activations + gradients apart.
    gradient_bytes = sum(g.untyped_storage().nbytes() for g in grads.values())
    assert report.planned_bytes < fresh.program.report().planned_bytes + gradient_bytes


def test_a_call_never_overwrites_an_output_whose_storage_object_alone_is_kept() -> None:
    # torch keeps one UntypedStorage object per storage and it holds one use of the storage
    # however many names refer to it: the use count alone would call this block free.
    memory = CountingMemory()
    program, _ = program_over(memory)
    x1, x2 = torch.randn(2, 4, 8)
    first = program(x1)[0]
    storage = first.untyped_storage()
    kept = first.clone()
    del first
    gc.collect()
    program(x2)
    program(x2)
    again = torch.empty(0).set_(storage, 0, kept.shape, kept.stride())
    torch.testing.assert_close(again, kept)
    assert memory.allocations == 2  # the held block was never taken


def test_an_idle_block_goes_back_to_the_system_not_only_to_the_pool() -> None:
    from tensorarena.memory import HostMemory, Pool, Segments

    # a block of 1 KiB or more gets an arena of its own, as a large one in the default pool
    pool = Pool(HostMemory(), growth=Segments(threshold=1024, granularity=4096, small=4096),
                initial_size=0)
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(128, 8)  # blocks of a few pages: not two in one
    program = PlannedProgram.from_module(model, (x,), outputs="arena", resource=pool,
                                         kernel_arena=False)
    program(x)
    kept = program(x)  # the caller keeps one call's outputs through the next: a second block
    program(x)
    two = pool.statistics().reserved_bytes.current
    del kept
    torch.testing.assert_close(program(x), eager(model, x))
    # the idle block went back, and its arena (one of its own) with it
    assert pool.statistics().reserved_bytes.current < two
    assert pool.statistics().allocations.current == 1


def test_a_block_taken_without_code_gets_its_code_when_a_call_takes_it() -> None:
    from tensorarena.runtime.generated_code import Generated
    from tensorarena.runtime.held_arenas import HeldArenas

    made: list[tuple[str, int]] = []

    def code_maker(name: str) -> Callable[[torch.Tensor], Generated]:
        def make_code(memory: torch.Tensor) -> Generated:
            made.append((name, memory.data_ptr()))
            slot = memory[:16].view(torch.float32)  # the code's own reference to the block
            return Generated(lambda inputs: slot, "", {"slot": slot}, {})
        return make_code

    arenas = HeldArenas(code_maker("first"), 64, None, "cpu")
    recorded = arenas.take_block()  # the recording's block: no code compiled for it
    address = recorded.data_ptr()
    kept = torch.ops.aten.alias.default(recorded)  # the recorded call's output, kept
    del recorded
    assert made == [] and arenas.blocks == 1 and arenas.held == 1
    # A remake (the plan with kernels' allocations) passes over it: nothing compiled yet.
    assert arenas.remake(code_maker("second"), 64) and made == []
    del kept
    assert arenas.held == 0
    memory, code = arenas.take()  # the same block, its code made now, with the new maker
    assert memory.data_ptr() == address and made == [("second", address)]
    out = torch.ops.aten.alias.default(code.run([]))  # a caller's tensor over it counts
    assert arenas.held == 1
    del out
    assert arenas.held == 0  # its own use count took the new code's references in
    assert arenas.take()[0].data_ptr() == address and len(made) == 1  # made once
    arenas.release()
