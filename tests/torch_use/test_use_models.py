"""Real programs under ``tensorarena.torch.use``: a two-layer GPT-2 trained one AdamW step, bit
for bit as without it, on a pool behind a poisoning adaptor (freed bytes filled and held in
quarantine: a tensor that shared bytes with a freed one, or wrote after its free, shows)."""

from __future__ import annotations

import copy
import gc
import itertools
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _use_resources import FailAfter  # noqa: E402

import tensorarena as ta  # noqa: E402
from tensorarena.torch import use  # noqa: E402

pytestmark = pytest.mark.torch


def gpt2() -> Any:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                     n_positions=32, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def train_step(model: Any, ids: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(3)  # the same dropout masks in both runs
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return loss.detach().clone(), grads, weights


def test_a_gpt2_training_step_is_bit_identical_and_leaves_nothing_behind(shim: Any) -> None:
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    model = gpt2()
    twin = copy.deepcopy(model)
    expected = train_step(model, ids)
    pool = ta.Pool(ta.HostMemory())
    poisoning = ta.Poisoning(pool, quarantine="64MiB")
    with use(poisoning) as route:
        got = train_step(twin, ids)
    assert route.statistics().allocations.total > 100
    assert torch.equal(got[0], expected[0])
    for name in expected[1]:
        assert torch.equal(got[1][name], expected[1][name]), name
        assert torch.equal(got[2][name], expected[2][name]), name
    assert poisoning.check() > 0  # every freed block's poison intact: no write after a free
    del got, twin
    gc.collect()
    assert route.statistics().allocations.current == 0
    assert poisoning.statistics().live_blocks == 0 and not poisoning.corruptions
    poisoning.flush()
    assert pool.statistics().allocations.current == 0


def test_no_live_tensor_shares_a_byte_with_another(shim: Any) -> None:
    rng = random.Random(7)
    pool = ta.Pool(ta.HostMemory())
    poisoning = ta.Poisoning(pool, quarantine="256KiB", max_blocks=16)
    live: dict[int, Any] = {}
    with use(poisoning):
        for step in range(600):
            if live and rng.random() < 0.45:
                live.pop(rng.choice(list(live)))
            else:
                live[step] = torch.full((rng.randrange(1, 3000),), step, dtype=torch.int32)
            if step % 50 == 0:
                spans = sorted((t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in live.values())
                assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
                assert all(bool((t == key).all()) for key, t in live.items())
    assert all(bool((t == key).all()) for key, t in live.items())
    live.clear()
    poisoning.flush()  # raises UseAfterFreeError for any block written after its free
    assert pool.statistics().allocations.current == 0


def test_a_refusal_in_the_middle_of_a_forward_raises_and_leaks_nothing(shim: Any) -> None:
    model = gpt2()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(2))
    pool = ta.Pool(ta.HostMemory())
    refusing = FailAfter(pool, 40)
    with use(refusing) as route, pytest.raises(torch.OutOfMemoryError, match="FailAfter"):
        model(input_ids=ids, labels=ids).loss.backward()
    assert route.statistics().num_ooms >= 1 and route.statistics().allocations.total == 40
    gc.collect()
    assert route.statistics().allocations.current == 0
    assert pool.statistics().allocations.current == 0
    loss = model(input_ids=ids, labels=ids).loss  # the program goes on, on torch's allocator
    assert torch.isfinite(loss)


class _Kernels(torch.nn.Module):
    """Ops whose kernels allocate scratch of their own (the planned executor's kernel arena)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)

    def forward(self, x: Any) -> Any:
        return self.conv(self.norm(x).transpose(1, 2)).transpose(1, 2).softmax(-1)


def test_a_planned_program_with_its_kernel_arena_runs_under_a_route(shim: Any) -> None:
    from tensorarena.runtime import PlannedProgram

    model, x = _Kernels(), torch.randn(2, 8, 16)
    with torch.no_grad():
        expected = model(x)
    program = PlannedProgram.from_module(model, (x,), kernel_arena="all")
    program(x)
    pool = ta.Pool(ta.HostMemory())
    with use(pool) as route:  # the shim installed twice over: by the route and by each call
        results = [program(x).clone() for _ in range(3)]
    assert all(torch.equal(r, expected) for r in results)
    assert program.report().kernel_served > 0 and route.statistics().allocations.total > 0
    assert not shim.installed()
    del results
    gc.collect()
    assert route.statistics().allocations.current == 0 and shim.outstanding() == 0
