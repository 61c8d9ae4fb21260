"""Growth policies: the next arena size each one asks for, and their frozen, typed shape."""

from __future__ import annotations

import dataclasses

import pytest

from tensorarena.errors import InvalidSizeError
from tensorarena.memory.growth import (
    Doubling,
    Fixed,
    GrowthPolicy,
    NextPowerOfTwo,
    SameAsRequested,
    Segments,
)

KiB = 1024
MiB = 1024 * KiB

POLICIES = [Fixed(), SameAsRequested(), NextPowerOfTwo(), Doubling("1MiB"), Segments()]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_every_policy_satisfies_the_protocol_and_is_frozen(policy: GrowthPolicy) -> None:
    assert isinstance(policy, GrowthPolicy)
    assert dataclasses.is_dataclass(policy)
    assert policy.__dataclass_params__.frozen  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Doubling("1MiB").maximum = 1  # type: ignore[misc]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("request_size", [1, 256, 1000, 3 * MiB, 5 * MiB + 1])
@pytest.mark.parametrize("reserved", [0, 1 * MiB, 64 * MiB])
def test_an_arena_is_never_smaller_than_the_request(
    policy: GrowthPolicy, request_size: int, reserved: int
) -> None:
    size = policy.next_size(request_size, reserved)
    assert size is None or size >= request_size


def test_fixed_only_makes_a_first_arena() -> None:
    assert Fixed().next_size(4096, 0) == 4096
    assert Fixed().next_size(1, 4096) is None


def test_same_as_requested() -> None:
    assert SameAsRequested().next_size(3000, 10 * MiB) == 3000


def test_next_power_of_two_doubles_arena_by_arena() -> None:
    policy = NextPowerOfTwo()
    assert policy.next_size(1000, 0) == 1024
    assert policy.next_size(1, 1 * MiB) == 2 * MiB
    assert policy.next_size(1, 3 * MiB) == 4 * MiB
    assert policy.next_size(5 * MiB, 1 * MiB) == 8 * MiB
    sizes, reserved = [], 1 * MiB
    for _ in range(4):
        size = policy.next_size(256, reserved)
        assert size is not None
        sizes.append(size)
        reserved += size
    assert sizes == [2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB]  # each arena doubles the last


def test_doubling_grows_by_the_pool_size_up_to_its_cap() -> None:
    policy = Doubling("4MiB")
    assert policy.maximum == 4 * MiB
    sizes, reserved = [], 1 * MiB
    for _ in range(5):
        size = policy.next_size(256, reserved)
        assert size is not None
        sizes.append(size)
        reserved += size
    assert sizes == [1 * MiB, 2 * MiB, 4 * MiB, 4 * MiB, 4 * MiB]
    assert policy.next_size(10 * MiB, 100 * MiB) == 10 * MiB  # above the cap: its own size
    assert policy.next_size(300, 0) == 300


def test_doubling_rejects_a_bad_maximum() -> None:
    with pytest.raises(InvalidSizeError, match="maximum"):
        Doubling(0)
    with pytest.raises(InvalidSizeError):
        Doubling("big")


def test_policies_compare_and_print_by_value() -> None:
    assert Doubling("1MiB") == Doubling(1 * MiB)
    assert repr(Doubling("1KiB")) == "Doubling(maximum=1024)"
    assert NextPowerOfTwo() == NextPowerOfTwo() and repr(Fixed()) == "Fixed()"


def test_segments_give_a_large_request_its_own_arena_rounded_to_the_granule() -> None:
    policy = Segments()  # 1 MiB threshold, 2 MiB granules, 8 MiB small arenas
    assert policy.next_size(1 * MiB, 0) == 2 * MiB  # exactly the threshold: large
    assert policy.next_size(2 * MiB, 512 * MiB) == 2 * MiB  # an exact fit: no slack
    assert policy.next_size(2 * MiB + 1, 0) == 4 * MiB  # one byte over: one more granule
    assert policy.next_size(25 * MiB, 100 * MiB) == 26 * MiB  # what is held changes nothing


def test_segments_put_small_requests_in_shared_arenas() -> None:
    policy = Segments()
    assert policy.next_size(1 * MiB - 1, 0) == 8 * MiB  # one byte under the threshold
    assert policy.next_size(1, 300 * MiB) == 8 * MiB


def test_segments_check_their_sizes() -> None:
    assert Segments("64KiB", "4KiB", "64KiB").next_size(64 * KiB + 1, 0) == 68 * KiB
    with pytest.raises(InvalidSizeError, match="small arenas"):
        Segments(threshold="2MiB", small="1MiB")
    with pytest.raises(InvalidSizeError):
        Segments(granularity=0)


def test_a_pool_with_segments_reserves_a_large_block_exactly_and_trims_it() -> None:
    from tensorarena.memory import HostMemory, Pool

    pool = Pool(HostMemory(), growth=Segments(), initial_size=2 * MiB)
    small = pool.allocate(4 * KiB)
    large = pool.allocate(5 * MiB)  # fits in no arena: one of its own, 6 MiB, not 8 or 16
    assert pool.statistics().reserved_bytes.current == 2 * MiB + 6 * MiB
    pool.deallocate(large, 5 * MiB)
    assert pool.trim() == 6 * MiB  # the large block's arena was empty: it goes back whole
    pool.deallocate(small, 4 * KiB)
    pool.close()


def test_a_pool_with_segments_gives_back_an_outgrown_empty_arena_when_it_grows() -> None:
    from tensorarena.memory import HostMemory, Pool

    pool = Pool(HostMemory(), growth=Segments(), initial_size=2 * MiB)
    first = pool.allocate(3 * MiB)  # an arena of 4 MiB
    other = pool.allocate(9 * MiB)  # 10 MiB; the empty first arena (2 MiB) is outgrown: it goes
    assert pool.statistics().reserved_bytes.current == 4 * MiB + 10 * MiB
    pool.deallocate(first, 3 * MiB)
    pool.deallocate(other, 9 * MiB)
    again = pool.allocate(4 * MiB)  # an exact fit in the empty 4 MiB arena: nothing released
    assert pool.statistics().reserved_bytes.current == 4 * MiB + 10 * MiB
    grown = pool.allocate(11 * MiB)  # fits in no arena: the empty 10 MiB one goes
    assert pool.statistics().reserved_bytes.current == 4 * MiB + 12 * MiB
    pool.deallocate(again, 4 * MiB)
    pool.deallocate(grown, 11 * MiB)
    pool.close()


def test_other_policies_keep_their_empty_arenas_when_the_pool_grows() -> None:
    from tensorarena.memory import HostMemory, Pool

    pool = Pool(HostMemory(), growth=SameAsRequested(), initial_size=1 * MiB)
    small = pool.allocate(2 * MiB)
    pool.deallocate(small, 2 * MiB)
    large = pool.allocate(3 * MiB)
    assert pool.statistics().reserved_bytes.current == 1 * MiB + 2 * MiB + 3 * MiB
    pool.deallocate(large, 3 * MiB)
    pool.close()
