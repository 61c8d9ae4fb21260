"""One conformance suite for every placement strategy, driven through ``Arena`` by hypothesis.

A stateful machine allocates (sizes skewed small with some large ones, random power-of-two
alignments), deallocates, double-frees, frees with the wrong size and resets at random, and after
every step checks the arena's own invariants and the test's independent model: live blocks never
overlap, each is aligned and inside the region, the allocated bytes are exact, and an empty arena
of a coalescing strategy is its initial free-extent set again (one extent; a buddy system's
initial blocks). Failed calls must leave the arena exactly as it was. Derandomized, so CI runs the
same cases every time.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tensorarena.core import STRATEGIES, Arena
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidSizeError,
    OutOfMemoryError,
    SizeMismatchError,
)

# Log-distributed: a power of two is drawn first, then a size up to it, so small requests
# dominate (as in real workloads) while some are large for the region.
SIZES = st.integers(0, 18).flatmap(lambda e: st.integers(1 << e >> 1 or 1, 1 << e))
ALIGNMENTS = st.sampled_from([1, 2, 8, 64, 256, 256, 256, 1024, 4096])
# A power of two, an odd size, one whose buddy cover has several blocks and an unused tail, and
# a small one where refusals (and the strategies' fallback searches) are common.
CAPACITIES = st.sampled_from([1 << 20, 1_000_003, (1 << 19) + (1 << 16) + 3000, 70_000])


def snapshot(arena: Arena) -> tuple[object, ...]:
    """Everything observable about an arena's state, to prove a failed call changed nothing."""
    return (
        arena.live_blocks(),
        dataclasses.replace(arena.statistics(), num_ooms=0),  # refusals are counted, only that
        arena.free_extents(),
        arena.free_bytes(),
        arena.largest_free(),
    )


def initial_extents(arena: Arena) -> list[tuple[int, int]]:
    """What a coalescing strategy's free space is when nothing is live (from a fresh one)."""
    initial = getattr(STRATEGIES[arena.strategy_name](arena.capacity), "initial_extents", None)
    return initial() if initial is not None else [(0, arena.capacity)]


class ArenaMachine(RuleBasedStateMachine):
    """The model: address → (requested, alignment) of every live block."""

    strategy_name = "first_fit"
    blocks = Bundle("blocks")

    def __init__(self) -> None:
        super().__init__()
        self.arena: Arena | None = None
        self.model: dict[int, tuple[int, int]] = {}

    @initialize(capacity=CAPACITIES)
    def create(self, capacity: int) -> None:
        self.arena = Arena(capacity, self.strategy_name)
        self.model = {}
        assert self.arena.free_extents() == initial_extents(self.arena)

    @rule(target=blocks, nbytes=SIZES, alignment=ALIGNMENTS)
    def allocate(self, nbytes: int, alignment: int) -> tuple[int, int]:
        arena = self.arena
        assert arena is not None
        before = snapshot(arena)
        try:
            address = arena.allocate(nbytes, alignment)
        except OutOfMemoryError as error:
            assert snapshot(arena) == before, "a refused allocation changed the arena"
            assert error.requested == nbytes and error.capacity == arena.capacity
            assert error.free == arena.free_bytes()
            assert error.largest_free == arena.largest_free()
            return (-1, nbytes)
        assert address % alignment == 0, f"{address:#x} not aligned to {alignment}"
        assert address >= 0 and address + nbytes <= arena.capacity, "block outside the region"
        assert address not in self.model
        self.model[address] = (nbytes, alignment)
        return (address, nbytes)

    @rule(block=consumes(blocks))
    def deallocate(self, block: tuple[int, int]) -> None:
        arena = self.arena
        assert arena is not None
        address, nbytes = block
        if address in self.model:
            if self.model[address][0] == nbytes:
                arena.deallocate(address, nbytes if address % 2 == 0 else None)
                del self.model[address]
            return  # otherwise a stale handle: its address was handed out again since
        # Freed already (by reset), or never allocated: refused, nothing changes.
        before = snapshot(arena)
        expected = DoubleFreeError if address >= 0 else InvalidAddressError
        with pytest.raises(expected):
            arena.deallocate(address)
        assert snapshot(arena) == before

    # Allocation is three rules of the six so that blocks pile up (hypothesis picks rules evenly).
    @rule(target=blocks, nbytes=SIZES, alignment=ALIGNMENTS)
    def allocate_more(self, nbytes: int, alignment: int) -> tuple[int, int]:
        return self.allocate(nbytes, alignment)

    @rule(target=blocks, nbytes=st.integers(1, 2048))
    def allocate_small(self, nbytes: int) -> tuple[int, int]:
        return self.allocate(nbytes, 256)

    @rule(data=st.data(), kind=st.sampled_from(["twice", "wrong_size", "foreign"]))
    def misuse(self, data: st.DataObject, kind: str) -> None:
        """A double free, a free with the wrong size, or a foreign address: refused, no change."""
        arena = self.arena
        assert arena is not None
        if kind == "foreign" or not self.model:
            address = data.draw(st.integers(-5, 2 << 20))
            if arena.is_live(address):
                return
            before = snapshot(arena)
            with pytest.raises(InvalidAddressError):
                arena.deallocate(address)
            assert snapshot(arena) == before
            return
        address = data.draw(st.sampled_from(sorted(self.model)))
        if kind == "twice":
            arena.deallocate(address)
            del self.model[address]
            before = snapshot(arena)
            with pytest.raises(DoubleFreeError):
                arena.deallocate(address)
        else:
            before = snapshot(arena)
            delta = data.draw(st.sampled_from([-1, 1, 4096]))
            wrong = self.model[address][0] + delta
            with pytest.raises(SizeMismatchError if wrong > 0 else InvalidSizeError):
                arena.deallocate(address, wrong)
        assert snapshot(arena) == before

    @precondition(lambda self: len(self.model) >= 12)
    @rule()
    def reset(self) -> None:
        arena = self.arena
        assert arena is not None
        arena.reset()
        self.model.clear()

    @invariant()
    def consistent(self) -> None:
        arena = self.arena
        if arena is None:
            return
        arena._check_invariants()
        assert arena.live_blocks() == {a: n for a, (n, _) in self.model.items()}
        stats = arena.statistics()
        assert stats.requested_bytes.current == sum(n for n, _ in self.model.values())
        assert stats.allocations.current == len(self.model)
        assert stats.free_bytes <= arena.capacity - sum(n for n, _ in self.model.values())
        previous_end = 0
        for address in sorted(self.model):
            nbytes, alignment = self.model[address]
            assert address >= previous_end, "live blocks overlap"
            assert address % alignment == 0
            previous_end = address + nbytes
        assert previous_end <= arena.capacity
        if not self.model and STRATEGIES[arena.strategy_name].coalesces:
            initial = initial_extents(arena)
            assert arena.free_extents() == initial
            if len(initial) == 1:
                assert stats.fragmentation == 0.0


SETTINGS = settings(
    max_examples=30,
    stateful_step_count=100,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _machine_for(name: str) -> type[ArenaMachine]:
    return type(f"{name.title().replace('_', '')}Machine", (ArenaMachine,), {"strategy_name": name})


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_strategy_conformance(name: str) -> None:
    run_state_machine_as_test(_machine_for(name), settings=SETTINGS)


def test_every_strategy_is_in_the_suite() -> None:
    expected = ["first_fit", "next_fit", "best_fit", "segregated_fit", "buddy", "tlsf"]
    assert list(STRATEGIES) == expected
