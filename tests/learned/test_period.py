"""Finding the step of an unmarked allocation sequence: period, phase, and what is not a step."""

from __future__ import annotations

import pytest

from tensorarena.errors import InvalidArgumentError
from tensorarena.learned import LearnedPlans, Period, PeriodDetector
from tensorarena.memory.virtual import VirtualMemory


def _feed(detector: PeriodDetector, tokens: list[tuple[int, int]]) -> list[tuple[int, Period]]:
    return [(i, found) for i, (nbytes, live) in enumerate(tokens)
            if (found := detector.observe(nbytes, live)) is not None]


def _step_tokens(sizes: list[int], base: int) -> list[tuple[int, int]]:
    """A step that allocates ``sizes`` and keeps them to its end: (size, level before)."""
    tokens, level = [], base
    for nbytes in sizes:
        tokens.append((nbytes, level))
        level += nbytes
    return tokens


STEP = [512, 64, 4096, 64, 2048, 128, 64, 8192]


def test_a_period_after_a_warm_up_prefix_is_found_at_its_second_repeat() -> None:
    warm_up = _step_tokens([1000, 3000, 5000], 0)  # makes lasting state: the base rises
    steps = [t for _ in range(4) for t in _step_tokens(STEP, 9000)]
    found = _feed(PeriodDetector(min_run=16), warm_up + steps)
    assert found, "no period found"
    index, period = found[0]
    assert period.length == len(STEP)
    # The warm-up sits below the steady level: the period is taken once it ran three times.
    assert index == len(warm_up) + 3 * len(STEP) - 1
    assert period.phase == len(warm_up) % len(STEP)  # steps begin where the level is lowest
    assert period.next_boundary(index + 1) == len(warm_up) + 3 * len(STEP)


def test_without_a_warm_up_the_level_test_finds_the_period_at_once() -> None:
    steps = [t for _ in range(3) for t in _step_tokens(STEP, 9000)]
    (index, period), *_ = _feed(PeriodDetector(), steps)
    assert (index, period.length, period.phase) == (2 * len(STEP) - 1, len(STEP), 0)


def test_a_loop_inside_a_step_is_not_a_step() -> None:
    # Each step runs a ping-pong of two scalars above its base level: those tokens repeat with
    # period 2 inside every step, but the level there is not the lowest of the window.
    inner = [(8, 9000 + 4096), (4, 9000 + 4096)] * 6
    step = [(4096, 9000), *inner, (256, 9000 + 4096)]
    found = _feed(PeriodDetector(base_window=64), step * 4)
    assert found and found[0][1].length == len(step)


def test_a_rejected_length_is_not_offered_again() -> None:
    tokens = [t for _ in range(6) for t in _step_tokens(STEP, 0)]
    detector = PeriodDetector()
    detector.reject(len(STEP))
    found = _feed(detector, tokens)
    assert all(period.length != len(STEP) for _, period in found)


def test_a_sequence_that_never_repeats_has_no_period() -> None:
    tokens = [(64 * (i + 1), i) for i in range(500)]
    assert _feed(PeriodDetector(), tokens) == []


def test_a_drifting_level_is_not_detected() -> None:
    # Each step keeps one output: the level at every position rises from step to step.
    tokens = [t for k in range(6) for t in _step_tokens(STEP, 100 * k)]
    assert _feed(PeriodDetector(), tokens) == []


def test_bad_options() -> None:
    with pytest.raises(InvalidArgumentError):
        PeriodDetector(min_period=0)
    with pytest.raises(InvalidArgumentError):
        PeriodDetector(min_period=8, max_period=4)
    with pytest.raises(InvalidArgumentError):
        PeriodDetector(base_window=-1)
    with pytest.raises(InvalidArgumentError):
        PeriodDetector(min_run=0)


def _run_steps(plans: LearnedPlans, steps: int, warm_up: bool) -> None:
    kept = []
    if warm_up:  # optimizer-like state, made once and kept
        kept = [plans.allocate(100_000), plans.allocate(100_000)]
    for _ in range(steps):
        live = []
        for nbytes in STEP:
            live.append((plans.allocate(nbytes), nbytes))
            if len(live) > 3:
                plans.deallocate(*live.pop(0))
        for block in live:
            plans.deallocate(*block)
    for address in kept:
        plans.deallocate(address, 100_000)


@pytest.mark.parametrize("warm_up", [False, True])
def test_the_resource_finds_its_steps_and_serves_them(warm_up: bool) -> None:
    plans = LearnedPlans(VirtualMemory(), detect_steps=True)
    _run_steps(plans, 16, warm_up)
    report = plans.report()
    assert report.period == len(STEP)
    # Two steps to find the period (after a warm-up, min_run allocations), the rest served.
    found_after = 2 if not warm_up else 64 // len(STEP) + 1
    assert report.served == (16 - found_after) * len(STEP)
    assert report.steady_peak_reserved_bytes is not None
    (plan,) = report.plans
    assert plan.optimal
    plans._check_invariants()
    assert len(plans) == 0

