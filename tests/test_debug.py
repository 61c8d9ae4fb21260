"""Debug checks graded by cost, chosen when an allocator is made, firing on corrupt state."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tensorarena import Arena, Pool, VirtualMemory
from tensorarena.debug import CHEAP, EXPENSIVE, OFF, debug_level, set_debug_level
from tensorarena.errors import InvalidArgumentError, InvariantError


@pytest.fixture(autouse=True)
def _no_override() -> object:
    previous = set_debug_level(None)
    yield
    set_debug_level(previous)


def test_the_environment_is_read_when_an_allocator_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TENSORARENA_DEBUG used to be read at import and baked into default arguments."""
    monkeypatch.delenv("TENSORARENA_DEBUG", raising=False)
    assert Arena("1MiB").debug == OFF
    monkeypatch.setenv("TENSORARENA_DEBUG", "1")
    assert debug_level() == CHEAP and Arena("1MiB").debug == CHEAP
    monkeypatch.setenv("TENSORARENA_DEBUG", "2")
    assert Pool(VirtualMemory())._debug == EXPENSIVE
    monkeypatch.setenv("TENSORARENA_DEBUG", "0")
    assert Arena("1MiB").debug == OFF


def test_the_setter_overrides_the_environment_for_allocators_made_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TENSORARENA_DEBUG", "2")
    before = Arena("1MiB")
    set_debug_level(False)
    assert Arena("1MiB").debug == OFF and before.debug == EXPENSIVE
    set_debug_level(True)
    assert Arena("1MiB").debug == EXPENSIVE
    assert Arena("1MiB", debug=CHEAP).debug == CHEAP  # an explicit argument wins
    with pytest.raises(InvalidArgumentError):
        set_debug_level(7)
    with pytest.raises(InvalidArgumentError):
        Arena("1MiB", debug="yes")  # type: ignore[arg-type]


def _corrupt_arena() -> Arena:
    arena = Arena("1MiB", "first_fit")
    arena.allocate(1000)
    arena._reserve(4096, 256)  # bytes the strategy holds that no block accounts for
    return arena


def test_a_corrupt_arena_is_caught_by_the_expensive_checks_only() -> None:
    arena = _corrupt_arena()
    arena._check_invariants(CHEAP)  # the counters agree with each other: cheap cannot see it
    with pytest.raises(InvariantError, match="reserved bytes drift"):
        arena._check_invariants(EXPENSIVE)


def test_a_corrupt_counter_is_caught_by_the_cheap_checks() -> None:
    arena = Arena("1MiB", "tlsf")
    arena.allocate(1000)
    arena._requested_total += 10_000  # requested bytes above what the blocks occupy
    with pytest.raises(InvariantError, match="requested bytes exceed"):
        arena._check_invariants(CHEAP)


def test_debug_mode_raises_on_the_call_after_the_corruption() -> None:
    arena = Arena("1MiB", "best_fit", debug=EXPENSIVE)
    address = arena.allocate(100)
    arena._live[address + 4096] = 100  # a block the strategy never handed out
    with pytest.raises(InvariantError):
        arena.allocate(100)
    pool = Pool(VirtualMemory(), debug=CHEAP)
    block = pool.allocate(100)
    pool._reserved += 1  # the pool's bytes held from upstream no longer add up
    with pytest.raises(InvariantError, match="reserved bytes drift"):
        pool.deallocate(block, 100)


def test_checks_do_not_vanish_under_python_dash_o() -> None:
    code = textwrap.dedent("""
        from tensorarena import Arena
        from tensorarena.errors import InvariantError
        arena = Arena("1MiB", "first_fit")
        arena.allocate(1000)
        arena._reserve(4096, 256)
        try:
            arena._check_invariants()
        except InvariantError:
            print("caught")
    """)
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "caught"
