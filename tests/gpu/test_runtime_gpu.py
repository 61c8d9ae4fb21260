"""The planned executor with its arena on a real GPU (issue 12's last hook): a small
transformer planned on ``cuda:0`` runs with every intermediate in one block from
``tensorarena.device_pool(0)`` and gives eager's outputs, for inference and a training step.

Marked ``gpu`` and skipped, with the reason, where torch has no CUDA or the CUDA bindings are
missing; ``scripts/gpu_check.sh`` runs it on the lent GPU machine. The device-selection logic
itself is tested on the CPU (``tests/runtime/test_arena_device.py``).
"""

from __future__ import annotations

import importlib.util
import math

import pytest


def _why_not() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if importlib.util.find_spec("cuda") is None:
        return "the CUDA bindings (cuda-python, the 'cuda' extra) are not installed"
    from tensorarena.memory.cuda import cuda_available

    if not cuda_available():
        return "no CUDA device is visible to the CUDA runtime"
    return None


_REASON = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.torch,
              pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

if _REASON is None:
    import torch
    from torch import nn

    from tensorarena.memory import device_pool
    from tensorarena.runtime import PlannedProgram, TrainingStep

    class Block(nn.Module):
        """A GPT-2-style block: layer norm, causal attention, a GELU MLP, residuals."""

        def __init__(self, width: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch, seq, width = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
            q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(batch, seq, width))
            return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))

    class TinyGPT(nn.Module):
        """Two blocks over token and position embeddings, tied output head."""

        def __init__(self, vocab: int = 128, width: int = 64, heads: int = 4) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(64, width)
            self.blocks = nn.ModuleList(Block(width, heads) for _ in range(2))
            self.norm = nn.LayerNorm(width)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.tokens.weight.t() / math.sqrt(x.shape[-1])


def _model_and_ids() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyGPT().cuda(), torch.randint(0, 128, (2, 16), device="cuda")


def test_a_model_planned_on_the_gpu_runs_in_one_device_block_and_equals_eager() -> None:
    model, ids = _model_and_ids()
    model.eval()
    pool = device_pool(0)
    before = pool.statistics().allocated_bytes.current
    program = PlannedProgram.from_module(model, (ids,))
    assert program.device == "cuda:0"
    with torch.no_grad():
        expected = model(ids)
    for _ in range(3):  # steady state: the same block every call
        got = program(ids)
        torch.testing.assert_close(got, expected)
    memory = program.workspace.memory
    assert memory.is_cuda and memory.device.index == 0
    assert program.workspace.statistics().grows == 1
    report = program.report()
    assert report.counts["out"] > 0 and report.planned_bytes == memory.numel()
    assert pool.statistics().allocated_bytes.current - before >= memory.numel()
    start = memory.data_ptr()
    slots = program.compiler.last.generated.slots  # type: ignore[union-attr]
    assert slots and all(start <= t.data_ptr() < start + memory.numel() and t.is_cuda
                         for t in slots.values())
    assert got.data_ptr() not in range(start, start + memory.numel())  # handed over, not a slot
    program.verify(ids)  # dead slots poisoned on the device: outputs still equal
    del program, slots, memory
    torch.cuda.synchronize()


def test_a_training_step_planned_on_the_gpu_equals_eager() -> None:
    model, ids = _model_and_ids()
    model.train()
    step = TrainingStep(model, (ids,))
    assert step.program.device == "cuda:0"
    loss, grads = step(ids)
    model.zero_grad(set_to_none=True)
    from tensorarena.planning.torch_frontend import default_loss

    expected = default_loss(model(ids))
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grads, {n: p.grad for n, p in model.named_parameters()})
    assert step.program.workspace.memory.is_cuda
    step.verify(ids)
