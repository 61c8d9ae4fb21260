"""How a pool picks an arena: it asks each strategy, and does not use a refusal as control flow."""

from __future__ import annotations

import pytest

from tensorarena import Arena, Pool, VirtualMemory
from tensorarena.core import STRATEGIES


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_fragmented_arena_is_skipped_without_a_refusal(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = Pool(VirtualMemory(), strategy=strategy, initial_size="1MiB")
    blocks = [pool.allocate(4096) for _ in range(256)]
    for address in blocks[::2]:  # half the bytes free, no extent over 4 KiB
        pool.deallocate(address, 4096)
    pool.deallocate(pool.allocate(1 << 20), 1 << 20)  # a second arena
    refusals = 0
    refused = Arena._refused

    def counting(self: Arena, nbytes: int, alignment: int) -> Exception:
        nonlocal refusals
        refusals += 1
        return refused(self, nbytes, alignment)

    monkeypatch.setattr(Arena, "_refused", counting)
    address = pool.allocate(64 << 10)
    _, second = pool.arenas
    assert second.base <= address < second.base + second.capacity
    assert second.statistics.allocations.current == 1
    assert refusals == 0
    pool.deallocate(address, 64 << 10)
    pool._check_invariants()
