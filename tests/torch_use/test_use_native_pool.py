"""``tensorarena.torch.use(NativePool(...))``: a route that takes its blocks from the pool in C++,
with no Python call (torch/native_pool.py, interop/_torch_cpu_native_pool.cpp, the hook in
interop/_torch_cpu_routes.cpp). Freed bytes are poisoned by hand (every free extent of the arena
filled), so a live tensor that shared bytes with a freed block shows."""

from __future__ import annotations

import copy
import ctypes
import gc
import itertools
import random
import threading
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import tensorarena as ta  # noqa: E402
from tensorarena.torch import NativePool, routed_blocks, use  # noqa: E402

pytestmark = pytest.mark.torch


class Counted(NativePool):
    """A native pool that counts the Python calls made to it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
        self.calls += 1
        return super().allocate(nbytes, alignment, stream)

    def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
        self.calls += 1
        super().deallocate(address, nbytes, stream)


def poison(pool: NativePool) -> None:
    for address, nbytes in pool.free_extents():
        ctypes.memset(address, 0xDD, nbytes)


@pytest.fixture
def pool(shim: Any) -> Any:
    made = Counted(size="64MiB")
    yield made
    gc.collect()
    assert made.statistics().allocations.current == 0


def test_tensors_come_from_the_arena_with_no_python_call(pool: Counted) -> None:
    with use(pool) as route:
        made = torch.full((300, 7), 3.0)
        product = made.T @ made
        assert pool.owns(made.data_ptr()) and pool.owns(product.data_ptr())
    assert torch.equal(product, torch.full((7, 7), 2700.0))
    del made, product
    assert pool.calls == 0 and pool.served == 2
    stats, routed = pool.statistics(), route.statistics()
    assert stats.allocations == routed.allocations == ta.Count(0, 2, 2)
    assert stats.requested_bytes == routed.allocated_bytes
    assert routed_blocks() == 0


def test_a_gpt2_training_step_is_bit_identical(pool: Counted) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                     n_positions=32, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))

    def step(model: Any) -> list[Any]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        torch.manual_seed(3)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        return [loss.detach().clone()] + [p.grad.clone() for p in model.parameters()] + [
            p.detach().clone() for p in model.parameters()]

    expected = step(model)
    with use(pool) as route:
        got = step(twin)
    poison(pool)  # a result that shared bytes with a freed block would change now
    assert pool.calls == 0 and route.statistics().allocations.total > 100
    assert pool.served == route.statistics().allocations.total
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    del got, twin, route
    gc.collect()
    assert pool.statistics().allocations.current == 0


def test_no_live_tensor_shares_a_byte_with_another_or_with_freed_bytes(pool: Counted) -> None:
    rng = random.Random(7)
    live: dict[int, Any] = {}
    with use(pool):
        for step in range(600):
            if live and rng.random() < 0.45:
                live.pop(rng.choice(list(live)))
            else:
                live[step] = torch.full((rng.randrange(1, 3000),), step, dtype=torch.int32)
            if step % 50 == 0:
                poison(pool)
                spans = sorted((t.data_ptr(), t.data_ptr() + 4 * t.numel()) for t in live.values())
                assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
                assert all(bool((t == key).all()) for key, t in live.items())
    assert pool.calls == 0
    live.clear()


def test_a_full_arena_costs_one_python_call_to_the_fallback(shim: Any) -> None:
    upstream = ta.Pool(ta.HostMemory())
    pool = Counted(size=4096, fallback=upstream)
    with use(pool) as route:
        whole = torch.empty(4096, dtype=torch.uint8)  # the exact fit, natively
        assert whole.data_ptr() == pool.base and pool.calls == 0
        over = torch.ones(100, dtype=torch.uint8)  # no room: one call, the fallback's block
        assert pool.calls == 1 and not pool.owns(over.data_ptr())
        assert upstream.statistics().allocations.current == 1
        del over  # one call back
        assert pool.calls == 2 and upstream.statistics().allocations.current == 0
        del whole  # natively
        again = torch.empty(4096, dtype=torch.uint8)
    assert pool.calls == 2 and again.data_ptr() == pool.base
    assert route.statistics().allocations.total == 3 and pool.served == 2
    del again


def test_a_full_arena_without_fallback_is_torchs_out_of_memory_error(shim: Any) -> None:
    pool = Counted(size=4096)
    with use(pool) as route:
        whole = torch.empty(4096, dtype=torch.uint8)
        with pytest.raises(torch.OutOfMemoryError, match="does not grow"):
            torch.empty(1, dtype=torch.uint8)
        assert isinstance(route.last_error, ta.errors.OutOfMemoryError)
        del whole
        assert torch.empty(4096, dtype=torch.uint8).data_ptr() == pool.base
    assert route.statistics().num_ooms == 1 and pool.statistics().num_ooms == 1
    assert pool.statistics().allocations.current == 0


def test_tensors_freed_on_other_threads_go_back_natively(pool: Counted) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # intra-op workers may allocate and free without the GIL
    try:
        with use(pool) as route:
            made = [torch.randn(256, 256) for _ in range(8)]
            sums = [float((m @ m).sum()) for m in made]
    finally:
        torch.set_num_threads(threads)
    box: list[Any] = [made]
    del made

    def drop() -> None:
        box.clear()

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join()
    assert all(s == s for s in sums)  # finite: not NaN
    assert route.statistics().allocations.current == 0
    assert pool.calls == 0 and pool.statistics().allocations.current == 0


def test_the_route_keeps_the_pool_alive_while_its_tensors_live(shim: Any) -> None:
    upstream = ta.Pool(ta.HostMemory())
    pool = NativePool(upstream, size="1MiB")
    route = use(pool)
    kept = torch.full((1000,), 5.0)
    route.uninstall()
    gone = weakref.ref(pool)
    del pool, route
    gc.collect()
    assert gone() is not None and upstream.statistics().allocations.current == 1
    assert float(kept.sum()) == 5000.0
    del kept
    gc.collect()
    assert gone() is None and upstream.statistics().allocations.current == 0


def test_a_closed_pool_refuses_through_the_route(shim: Any) -> None:
    pool = NativePool(size="1MiB")
    with use(pool) as route:
        kept = torch.ones(100)
        pool.close()
        with pytest.raises(torch.OutOfMemoryError, match="closed"):
            torch.ones(100)
    assert route.statistics().num_ooms == 1 and pool.statistics().num_ooms == 0
    del kept
    assert pool.statistics().allocations.current == 0


def test_python_cannot_free_a_block_a_tensor_holds(pool: Counted) -> None:
    with use(pool):
        tensor = torch.full((100,), 2.0)
    before = pool.statistics()
    with pytest.raises(ta.errors.InvalidAddressError, match="torch frees it"):
        pool.deallocate(tensor.data_ptr(), 400)
    assert pool.statistics() == before and float(tensor.sum()) == 200.0
    del tensor


def test_python_books_serve_the_route_with_one_call_each(shim: Any) -> None:
    pool = Counted(size="1MiB", native=False)
    with use(pool):
        made = torch.ones(1000)
        assert pool.owns(made.data_ptr()) and pool.calls == 1
    del made
    assert pool.calls == 2 and pool.served == 0


def test_torchs_profiler_sees_natively_routed_allocations(pool: Counted) -> None:
    from tensorarena.trace.torch_recorder import record_torch

    with record_torch() as recording, use(pool):
        x = torch.ones(1000)
        y = (x * 3).sum()
        del x
    sizes = [e.nbytes for e in recording.trace.events if e.op == "a"]
    assert sizes.count(4000) == 2 and float(y) == 3000 and pool.calls == 0
    del y


def test_threads_allocating_and_freeing_at_once_lose_nothing(pool: Counted) -> None:
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        kept: list[Any] = []
        try:
            for i in range(300):
                kept.append(torch.full((seed * 100 + i % 7 + 1,), float(seed)))
                if len(kept) > 5:
                    assert bool((kept.pop(0) == seed).all())
                if i % 3 == 0:
                    pool.deallocate(pool.allocate(64 * (i % 5 + 1)), 64 * (i % 5 + 1))
        except BaseException as exc:  # reported below
            errors.append(exc)

    with use(pool) as route:
        workers = [threading.Thread(target=churn, args=(s,)) for s in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert not errors
    total = route.statistics().allocations.total
    assert total >= 1200 and pool.served == total  # every tensor natively
    stats = pool.statistics()
    assert stats.allocations.current == 0 and stats.free_extents == 1


def test_blocks_of_two_pools_go_back_each_to_its_own_after_both_routes_went(shim: Any) -> None:
    # A natively served block finds its pool by address (no table of blocks on the route): two
    # arenas live at once, the routes gone, the frees interleaved.
    outer, inner = Counted(size="1MiB"), Counted(size="1MiB")
    before = routed_blocks()
    with use(outer) as outer_route:
        kept_outer = [torch.full((100 + i,), 1.0) for i in range(5)]
        with use(inner) as inner_route:
            kept_inner = [torch.full((200 + i,), 2.0) for i in range(5)]
    assert all(outer.owns(t.data_ptr()) for t in kept_outer)
    assert all(inner.owns(t.data_ptr()) for t in kept_inner)
    assert routed_blocks() == before + 10
    del outer_route, inner_route
    gc.collect()
    for a, b in zip(kept_outer, kept_inner, strict=True):
        assert float(a.sum()) == a.numel() and float(b.sum()) == 2 * b.numel()
    del a, b
    for i in (4, 0, 2, 1, 3):
        kept_outer[i] = kept_inner[4 - i] = None  # type: ignore[call-overload]
    assert routed_blocks() == before
    for pool in (outer, inner):
        stats = pool.statistics()
        assert stats.allocations.current == 0 and stats.free_extents == 1 and pool.calls == 0
