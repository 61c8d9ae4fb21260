"""Kernels' own CPU allocations served from the planned arena (runtime/kernel_arena.py).

The shim is compiled once per machine (cached under ~/.cache/tensorarena); without a C++
compiler, ninja or torch's headers every test here but the fallback one is skipped, saying why.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tensorarena.runtime import (  # noqa: E402
    PlannedProgram,
    TrainingStep,
    kernel_arena,
)

pytestmark = pytest.mark.torch


@pytest.fixture(scope="session")
def shim() -> Any:
    reason = kernel_arena.unavailable()
    if reason:
        pytest.skip(f"kernel arena shim unavailable: {reason}")
    return kernel_arena.extension()


class Tiny(torch.nn.Module):
    """Ops whose kernels allocate inside: layer norm (out variant computes elsewhere and
    copies), attention (no out variant), a convolution (im2col columns), cumsum of a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        c = self.conv(a.transpose(1, 2)).transpose(1, 2)
        return self.norm(c + x) * (x > 0).cumsum(-1)


def tiny(**options: Any) -> tuple[PlannedProgram, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = Tiny().eval()
    x = torch.randn(2, 8, 16)
    return PlannedProgram.from_module(model, (x,), **options), model, x


def script(*entries: tuple[int, int]) -> bytearray:
    data = bytearray(struct.pack("<4Q", 0, 0, 0, len(entries)))
    for nbytes, offset in entries:
        data += struct.pack("<2Q", nbytes, offset)
    return data


def counters(data: bytearray) -> tuple[int, int, int]:
    served, forwarded, escaped, _ = struct.unpack_from("<4Q", data)
    return served, forwarded, escaped


def test_outputs_are_bit_identical_and_no_kernel_allocation_reaches_torch(shim: Any) -> None:
    program, model, x = tiny(kernel_arena="all")
    with torch.no_grad():
        expected = model(x)
    first, second = program(x), program(x)  # recorded, then served
    assert torch.equal(first, expected) and torch.equal(second, expected)
    report = program.report()
    assert report.kernel_arena == "on (all)"
    assert report.kernel_buffers > 0 and report.kernel_escaped == 0
    assert report.kernel_served > 0
    _, trace = program.trace_allocations(x)
    assert trace.planned_allocations == 0
    off, _, _ = tiny(kernel_arena=False)
    off(x)
    _, before = off.trace_allocations(x)
    assert before.planned_allocations > 0  # what the shim takes away
    assert off.report().kernel_arena == "off" and off.report().kernel_buffers == 0
    assert not shim.installed()  # restored once the call ended


def test_poisoned_verification_passes_with_kernel_allocations_planned(shim: Any) -> None:
    program, _, x = tiny()
    program(x)
    program.verify(x)
    assert program.report().kernel_escaped == 0


def test_training_step_gradients_are_bit_identical(shim: Any) -> None:
    torch.manual_seed(0)
    model = Tiny().train()
    x = torch.randn(2, 8, 16)
    step = TrainingStep(model, (x,), kernel_arena=True)
    loss, grads = step(x)
    loss, grads = step(x)
    model.zero_grad(set_to_none=True)
    eager = model(x).sum()
    eager.backward()
    assert torch.equal(loss, eager.detach())
    for name, p in model.named_parameters():
        assert torch.equal(grads[name], p.grad), name
    assert step.program.report().kernel_served > 0


def test_without_the_shim_the_program_runs_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_arena, "unavailable", lambda: "no C++ compiler (test)")
    program, model, x = tiny()
    with torch.no_grad():
        expected = model(x)
    assert torch.equal(program(x), expected) and torch.equal(program(x), expected)
    report = program.report()
    assert report.kernel_arena == "unavailable: no C++ compiler (test)"
    assert report.kernel_buffers == 0 and report.kernel_served == 0


def test_only_the_armed_thread_is_served(shim: Any) -> None:
    arena = torch.empty(4096, dtype=torch.uint8)
    base = arena.data_ptr()
    plan = script((1024, 0), (1024, 2048))
    other: list[int] = []

    def elsewhere() -> None:
        other.append(torch.empty(256, dtype=torch.float32).data_ptr())

    shim.install()
    try:
        shim.arm(plan, base)
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        first = torch.empty(256, dtype=torch.float32)
        second = torch.empty(256, dtype=torch.float32)
        third = torch.empty(256, dtype=torch.float32)  # beyond the script: forwarded
        assert (first.data_ptr(), second.data_ptr()) == (base, base + 2048)
        assert not base <= third.data_ptr() < base + 4096
        assert not base <= other[0] < base + 4096
        del first, second, third
        shim.disarm(plan)
    finally:
        shim.uninstall()
    assert counters(plan) == (2, 1, 0)
    assert shim.outstanding() == 0


def test_an_unexpected_size_ends_serving_and_a_kept_block_counts_as_escaped(shim: Any) -> None:
    arena = torch.empty(4096, dtype=torch.uint8)
    base = arena.data_ptr()
    plan = script((512, 0), (1024, 1024))
    shim.install()
    try:
        shim.arm(plan, base)
        odd = torch.empty(100, dtype=torch.uint8)  # not the 512 expected: serving stops
        later = torch.empty(1024, dtype=torch.uint8)
        shim.disarm(plan)
        assert not base <= odd.data_ptr() < base + 4096
        assert not base <= later.data_ptr() < base + 4096
        assert counters(plan) == (0, 2, 0)
        kept = script((512, 0))
        shim.arm(kept, base)
        held = torch.empty(512, dtype=torch.uint8)
        with pytest.raises(RuntimeError, match="already armed"):
            shim.arm(kept, base)
        shim.disarm(kept)
        assert held.data_ptr() == base and counters(kept) == (1, 0, 1)
        assert shim.outstanding() == 1
        del held
        assert shim.outstanding() == 0
    finally:
        shim.uninstall()


def test_two_outstanding_blocks_at_one_address_are_both_taken_back(shim: Any) -> None:
    # A block that escaped its node is still out when the same planned address is served again
    # (a later node, or the next call): freeing one of them must not hand the other to torch's
    # allocator, which would free arena memory. Run in a child: that crashed the interpreter.
    child = textwrap.dedent("""
        import struct
        import torch
        from tensorarena.runtime import kernel_arena

        shim = kernel_arena.extension()
        arena = torch.empty(4096, dtype=torch.uint8)  # offset 0: the address of its own block
        base = arena.data_ptr()
        kept = bytearray(struct.pack("<6Q", 0, 0, 0, 1, 512, 0))
        shim.install()
        blocks = []
        for _ in range(2):
            shim.arm(kept, base)
            blocks.append(torch.empty(512, dtype=torch.uint8))
            shim.disarm(kept)
        assert blocks[0].data_ptr() == blocks[1].data_ptr() == base
        assert struct.unpack_from("<3Q", kept) == (2, 0, 2) and shim.outstanding() == 2
        del blocks[1]
        assert shim.outstanding() == 1
        del blocks[0]
        assert shim.outstanding() == 0
        shim.uninstall()
        arena.fill_(1)
        del arena
        torch.empty(4096, dtype=torch.uint8).fill_(2)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", child],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == "ok"


def test_arm_refuses_a_bad_script(shim: Any) -> None:
    with pytest.raises(TypeError):
        shim.arm(b"not a bytearray", 0)
    with pytest.raises(ValueError, match="shorter"):
        shim.arm(bytearray(struct.pack("<4Q", 0, 0, 0, 5)), 0)
    with pytest.raises(TypeError):
        shim.arm(script(), 0, 1)
    shim.disarm(script())  # not armed: nothing happens


def test_the_recorded_memory_shows_kernel_allocations_inside_the_arena(shim: Any) -> None:
    from tensorarena.report import timeline_from_snapshot

    program, _, x = tiny()
    program(x)
    _, snapshot = program.record_memory(x)
    arena = program.workspace.memory
    inside = [a for a in snapshot["device_traces"][0] if a["action"] == "alloc"
              and a["frames"][0]["name"].startswith("arena: inside ")]
    assert len(inside) == program.report().kernel_buffers > 0
    assert all(arena.data_ptr() <= a["addr"] and a["addr"] + a["size"]
               <= arena.data_ptr() + arena.numel() for a in inside)
    timeline = timeline_from_snapshot(snapshot, name="tiny")  # replays: no block freed twice
    assert timeline.reserved is not None


def test_idle_keeps_the_arena_height_and_all_leaves_torch_nothing(shim: Any) -> None:
    off, model, x = tiny(kernel_arena=False)
    idle, _, _ = tiny(kernel_arena="idle")
    every, _, _ = tiny(kernel_arena="all")
    with torch.no_grad():
        expected = model(x)
    for program in (off, idle, every):
        program(x)
        assert torch.equal(program(x), expected)
    assert idle.report().planned_bytes <= off.report().planned_bytes
    assert idle.report().kernel_arena == "on (idle)"
    assert every.report().kernel_arena == "on (all)"
    _, trace = every.trace_allocations(x)
    assert trace.planned_allocations == 0


def test_a_bad_kernel_arena_value_is_refused() -> None:
    from tensorarena.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="kernel_arena"):
        tiny(kernel_arena="some")


def test_arenas_released_by_the_held_blocks_leave_the_shim_working(shim: Any) -> None:
    program, model, x = tiny(outputs="arena")
    with torch.no_grad():
        expected = model(x)
    kept = [program(x) for _ in range(3)]  # each call's outputs hold its block
    del kept
    for _ in range(3):  # takes one idle block, releases the others and their code
        assert torch.equal(program(x), expected)
    assert program.report().kernel_served > 0
    assert kernel_arena.unavailable() == ""  # a wrapper's module globals survive a release


# A custom op whose kernel keeps its scratch tensor when asked (as a cache would): served from
# the arena, the scratch then outlives its node.
_lib = torch.library.Library("tensorarena_kernel_test", "DEF")
_lib.define("keeps(Tensor x) -> Tensor")
_KEEP: list[bool] = [False]
_KEPT: list[torch.Tensor] = []


def _keeps(x: torch.Tensor) -> torch.Tensor:
    scratch = torch.empty(64, dtype=torch.float32)
    scratch.fill_(2.0)
    if _KEEP[0]:
        _KEPT.append(scratch)
    return x * scratch[0]


_lib.impl("keeps", _keeps, "CPU")
torch.library.register_fake("tensorarena_kernel_test::keeps")(lambda x: torch.empty_like(x))


class Keeps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tensorarena_kernel_test.keeps(x.sin()).cos()


def test_a_served_block_that_outlives_its_node_is_counted_and_its_node_disarmed(
        shim: Any) -> None:
    x = torch.randn(4, 8)
    expected = Keeps()(x)
    program = PlannedProgram.from_module(Keeps(), (x,), kernel_arena="all")
    program(x)
    assert torch.equal(program(x), expected)
    assert program.report().kernel_served > 0
    _KEEP[0] = True
    try:
        program(x)
    finally:
        _KEEP[0] = False
    assert program.report().kernel_escaped == 1 and shim.outstanding() == 1
    served = program.report().kernel_served
    assert torch.equal(program(x), expected)  # the node runs unarmed from now on
    assert program.report().kernel_served == served
    _KEPT.clear()
    assert shim.outstanding() == 0
