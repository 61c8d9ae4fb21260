"""The arena on the graph's device, decided on the CPU: fake CUDA tensors (a graph traced with
``make_fx`` over fake ``cuda:0`` inputs) and the simulated CUDA runtime (its "device" memory is host
memory). Only the last step, torch wrapping device memory as a CUDA tensor, is replaced here by
a CPU tensor over the same bytes; ``tests/gpu/test_runtime_gpu.py`` runs it for real."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from tensorarena.errors import (  # noqa: E402
    InvalidArgumentError,
    InvalidResourceError,
    ShapeNotCoveredError,
)
from tensorarena.interop.stream_pools import stream_ordered_pool  # noqa: E402
from tensorarena.memory import (  # noqa: E402
    HostMemory,
    device_pool,
)
from tensorarena.runtime import PlannedProgram, Workspace, device  # noqa: E402
from tensorarena.runtime.materialize import block  # noqa: E402
from tensorarena.runtime.shape_plans import specialization_for  # noqa: E402
from tensorarena.testing.cuda import Simulator, simulated  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Simulator]:
    """Two simulated devices as the process's runtime and registry; CUDA tensors become CPU
    tensors over the same (host) bytes, keeping the device array alive as torch would."""

    def host_view(array: Any, where: str) -> torch.Tensor:
        assert where == f"cuda:{array.device}"
        buffer = (ctypes.c_uint8 * array.nbytes).from_address(array.address)
        buffer.owner = array  # type: ignore[attr-defined]
        return torch.frombuffer(buffer, dtype=torch.uint8)

    monkeypatch.setattr(device, "_as_cuda_tensor", host_view)
    with simulated(devices=2, memory="64MiB") as sim:
        yield sim


def cuda_graph() -> torch.fx.GraphModule:
    """mm, relu, a CPU arange moved to the device, an add: traced on fake cuda:0 tensors."""
    with FakeTensorMode():
        x, w = torch.empty(4, 8, device="cuda"), torch.empty(8, 8, device="cuda")

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        scale = torch.arange(8.0) * 2  # on the CPU beside the device's tensors
        return (torch.relu(x @ w) * 2 + scale.to(x.device)).sum(0)

    return make_fx(f, tracing_mode="fake")(x, w)


def test_the_arena_device_is_the_graphs() -> None:
    assert device.graph_device(cuda_graph().graph) == "cuda:0"
    cpu = make_fx(lambda x: (x * 2).relu())(torch.randn(3))
    assert device.graph_device(cpu.graph) == "cpu"
    with FakeTensorMode():
        spread = [torch.empty(2, device="cuda:0"), torch.empty(2, device="cuda:1")]
    with pytest.raises(InvalidArgumentError, match=r"several devices \(cuda:0, cuda:1\)"):
        device.common_device(spread)


def test_a_device_block_comes_from_the_devices_pool_and_goes_back(fake_gpu: Simulator) -> None:
    pool = device_pool(0)
    memory = block(1000, device="cuda:0")
    stats = pool.statistics()
    assert stats.allocated_bytes.current >= 1000 and memory.numel() == 1000
    assert memory.data_ptr() % 256 == 0
    assert device_pool(1).statistics().allocated_bytes.current == 0
    view = memory[100:200]  # a slot keeps the block alive after the block's tensor is gone
    del memory
    gc.collect()
    assert pool.statistics().allocated_bytes.current >= 1000
    del view
    gc.collect()
    ordered = stream_ordered_pool(0)
    assert ordered.live_blocks() == {}, "freed, waiting for the legacy stream's event"
    ordered.synchronize()
    assert pool.statistics().allocated_bytes.current == 0


def test_a_resource_the_device_cannot_use_is_refused_before_allocating(
    fake_gpu: Simulator,
) -> None:
    with pytest.raises(InvalidResourceError, match=r"cuda:0 but HostMemory holds host memory"):
        block(64, HostMemory(), device="cuda:0")
    with pytest.raises(InvalidResourceError, match="allocates on device 1"):
        block(64, device_pool(1), device="cuda:0")
    with pytest.raises(InvalidResourceError, match="runs on the CPU but DevicePool holds device"):
        block(64, device_pool(0), device="cpu")
    assert device_pool(0).statistics().allocated_bytes.current == 0
    with pytest.raises(InvalidArgumentError, match="'cpu' or 'cuda:N'"):
        block(64, device="tpu:0")


def test_a_program_of_a_cuda_graph_lays_its_slots_over_device_memory(
    fake_gpu: Simulator,
) -> None:
    gm = cuda_graph()
    with pytest.raises(InvalidArgumentError, match="runs on cuda:0 but the workspace"):
        PlannedProgram.from_graph_module(gm, workspace=Workspace())
    program = PlannedProgram.from_graph_module(gm)
    assert program.device == "cuda:0" and program.workspace.device == "cuda:0"
    # Build the shape's plan and code (running it needs a GPU): the arena comes from the
    # device's pool and every slot lies inside it.
    current = specialization_for(program.compiler, {})
    memory = program.workspace.memory
    assert device_pool(0).statistics().allocated_bytes.current >= memory.numel() > 0
    start, end = memory.data_ptr(), memory.data_ptr() + memory.numel()
    slots = current.generated.slots
    assert slots and all(start <= t.data_ptr() < end for t in slots.values())
    # The CPU tensors of the graph stay out of the arena, as their ops make them.
    assert current.lowering.dynamic["arange"] == "on cpu, the arena is on cuda:0"
    assert current.lowering.paths["arange"].path == "dynamic"
    assert "mm" in slots  # the device's own intermediates are planned


def test_a_program_of_a_cuda_graph_refuses_host_tensors_naming_them(
    fake_gpu: Simulator,
) -> None:
    program = PlannedProgram.from_graph_module(cuda_graph())
    with pytest.raises(ShapeNotCoveredError, match=r"'x_1' is on cpu; .* built for cuda:0") as err:
        program(torch.randn(4, 8), torch.randn(8, 8))
    assert (err.value.got, err.value.expected) == (torch.device("cpu"), torch.device("cuda:0"))
    assert program.plans_made == 0  # refused before anything was planned
