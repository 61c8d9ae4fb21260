"""Learned plans served in C++ (``tensorarena.learned.native_serving``): a step that repeats its
plan costs no Python call per allocation, the plans book exactly what they would have booked
themselves, and nothing live is ever aliased: kept tensors, a plan replaced while its blocks
live, closing with blocks out, threads and fork."""

from __future__ import annotations

import gc
import os
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import tensorarena as ta  # noqa: E402
from tensorarena.learned.native_serving import NativeOccupancy  # noqa: E402
from tensorarena.learned.step_plan import Occupancy  # noqa: E402
from tensorarena.torch import LearnedSteps, learned, routed_blocks  # noqa: E402

pytestmark = pytest.mark.torch

#: One step's tensors (float64 elements), made in order; every second one frees the oldest.
SIZES = (512, 1024, 512, 2048, 256, 1024, 768, 512)


def run_step(number: int, sizes: tuple[int, ...] = SIZES, keep: list[Any] | None = None,
             index: int = 2) -> list[Any]:
    """Make the step's tensors, each filled with its own value; return what is still live.
    ``keep`` gets the one at ``index`` (which the step frees otherwise)."""
    live = []
    for i, n in enumerate(sizes):
        live.append(torch.full((n,), float(number * 100 + i), dtype=torch.float64))
        if i == index and keep is not None:
            keep.append(live[-1])
        if i % 2:
            assert torch.all(live[0] == live[0][0])  # still its own value
            live.pop(0)
    return live


def counting_steps(**options: Any) -> tuple[LearnedSteps, list[int]]:
    """Installed steps whose plans count the route's calls of ``allocate``."""
    steps = LearnedSteps(**options)
    calls = [0]
    allocate = steps.plans.allocate

    def counted(nbytes: int, alignment: int = 64, stream: Any = None) -> int:
        calls[0] += 1
        return allocate(nbytes, alignment, stream)

    steps.plans.allocate = counted  # type: ignore[method-assign]
    return steps.install(), calls


def test_a_repeating_step_is_served_with_no_python_call_per_allocation(shim: Any) -> None:
    steps, calls = counting_steps()
    per_step = []
    with steps:
        for number in range(6):
            before = calls[0]
            with steps.step():
                run_step(number)
            per_step.append(calls[0] - before)
        report = steps.report()
    key, made = 4, report.allocations // 6  # the plans' key_length; allocations per step
    # Step 0 is recorded; step 1 (its plan's first) chooses the plan in Python by its key and
    # is served natively past it; from step 2 on, the plan is the one served before and the
    # server serves the whole step, its key included.
    assert per_step == [made, key, 0, 0, 0, 0]
    assert steps.native_served == (made - key) + 4 * made
    assert report.served == 5 * made and report.fell_back == made


def test_without_native_every_allocation_calls_the_plans(shim: Any) -> None:
    steps, calls = counting_steps(native=False)
    with steps:
        for number in range(4):
            with steps.step():
                run_step(number)
    assert calls[0] == steps.report().allocations and steps.native_served == 0
    with pytest.raises(ta.errors.InvalidArgumentError):
        learned(native=1)  # type: ignore[arg-type]


def scenario(steps: LearnedSteps) -> list[Any]:
    """Steps that keep tensors across steps, change pattern, and repeat: what they keep."""
    kept = []
    for number in range(12):
        sizes = SIZES if number < 4 or number >= 8 else (*SIZES[:5], 4096, *SIZES[6:])
        with steps.step():  # a kept block outlives its step: its slot is occupied in the next
            run_step(number, sizes, kept if number in (2, 10) else None)
        if number == 11:
            kept.pop(0)
        steps.plans._check_invariants()
    return kept


def test_native_serving_books_what_the_plans_would_have(shim: Any) -> None:
    results = []
    for native in (True, False):
        counting = ta.Counting(ta.HostMemory())
        with learned(counting, native=native) as steps:
            kept = scenario(steps)
            report, stats = steps.report(), steps.statistics()
        results.append((report, stats, [float(t[0]) for t in kept], kept))
        assert native == (steps.native_served > 0)
    (report, stats, values, kept), (expected, expected_stats, expected_values, _) = results
    assert report == expected and stats == expected_stats and values == expected_values
    assert report.slot_occupied > 0 and report.plans_learned > 1  # kept blocks; re-learned
    for tensor, value in zip(kept, values, strict=True):  # never overwritten by later steps
        assert torch.all(tensor == value)


def test_blocks_freed_first_by_the_next_step_are_booked_the_same_natively(shim: Any) -> None:
    # What a step leaves live is freed first by the next (zero_grad at the start): the second
    # step is served by the pool, the third on by a cyclic plan; native or not, the same.
    results = []
    for native in (True, False):
        with learned(ta.Counting(ta.HostMemory()), native=native) as steps:
            carried: list[tuple[Any, float]] = []
            for number in range(6):
                with steps.step():
                    # never overwritten since their step (numpy: no allocation)
                    assert all((t.numpy() == value).all() for t, value in carried)
                    carried.clear()
                    carried += [(t, float(t[0])) for t in run_step(number)]
                steps.plans._check_invariants()
            results.append((steps.report(), steps.statistics()))
            assert native == (steps.native_served > 0)
            carried.clear()
    assert results[0] == results[1]
    report = results[0][0]
    made = report.allocations // 6
    assert report.carried_blocks == made and report.outlived_recording == 0
    assert report.served == 4 * made


def test_a_replaced_plans_blocks_are_freed_into_their_own_arena(shim: Any) -> None:
    counting = ta.Counting(ta.HostMemory())
    with learned(counting) as steps:
        old: list[Any] = []  # served natively from the first plan, kept while it is replaced
        for number in range(3):
            with steps.step():
                served = steps.native_served
                run_step(number, keep=old if number == 2 else None, index=5)
        assert steps.native_served > served
        other = (*SIZES[:5], 4096, *SIZES[6:])
        for number in range(3, 7):  # differs the same way twice: planned again
            with steps.step():
                run_step(number, other)
        assert steps.report().plans_learned >= 2
        values = [float(t[0]) for t in old]
        assert all(torch.all(t == v) for t, v in zip(old, values, strict=True))
        held = counting.statistics().allocations.current
        del old
        gc.collect()
        # The old plan's arena went back with its last block (booked as it was freed).
        assert counting.statistics().allocations.current == held - 1
        steps.plans._check_invariants()
    assert routed_blocks() == 0


def test_blocks_served_natively_outlive_close_then_give_their_arena_back(shim: Any) -> None:
    counting = ta.Counting(ta.HostMemory())
    with learned(counting) as steps:
        for number in range(4):
            with steps.step():
                kept = run_step(number)
    assert steps.native_served > 0 and kept
    plans = steps.plans
    del steps
    gc.collect()
    assert all(torch.all(t == t[0]) for t in kept) and len(plans) == len(kept)
    del kept
    gc.collect()
    assert len(plans) == 0 and counting.statistics().allocations.current == 0
    assert routed_blocks() == 0


def test_threads_allocating_under_native_serving_never_alias(shim: Any) -> None:
    errors: list[BaseException] = []

    def work(seed: int, steps: LearnedSteps) -> None:
        try:
            for number in range(20):
                live = run_step(seed * 1000 + number)
                assert all(torch.all(t == t[0]) for t in live)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with learned(max_patterns=2) as steps:
        for number in range(4):
            with steps.step():
                run_step(number)
        for _ in range(3):
            workers = [threading.Thread(target=work, args=(s, steps)) for s in range(3)]
            with steps.step():
                for worker in workers:
                    worker.start()
                run_step(7)
                for worker in workers:
                    worker.join()
            steps.plans._check_invariants()
        report = steps.report()
    assert not errors
    assert report.served + report.fell_back == report.allocations
    assert routed_blocks() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_serves_and_frees_on_its_copy(shim: Any) -> None:
    with learned() as steps:
        for number in range(3):
            with steps.step():
                kept = run_step(number)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                for number in range(3, 6):
                    with steps.step():
                        run_step(number)
                del kept[:]
                gc.collect()
                steps.plans._check_invariants()
                code = 0 if steps.native_served > 0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        with steps.step():
            run_step(9)
        steps.plans._check_invariants()
    del kept


@pytest.mark.parametrize("seed", range(3))
def test_the_native_occupancy_is_the_python_one(shim: Any, seed: int) -> None:
    # Exact fit, touching ranges, and ranges that overlap by one byte, against Occupancy.
    with learned() as steps:
        for number in range(2):
            with steps.step():
                run_step(number)
        with steps.step():
            run_step(2)
        server = steps._server
        assert server is not None
        (plan,) = server._tables.values()
        native = plan.occupancy
        assert isinstance(native, NativeOccupancy)
        reference = Occupancy()
        for lo, hi in native.ranges():
            reference.take(lo, hi)
        chance = random.Random(seed)
        check: Callable[[int, int], bool] = reference.is_free
        for _ in range(400):
            lo = chance.randrange(0, 1 << 14, 8)
            hi = lo + chance.choice([0, 8, 64, 512])
            assert native.is_free(lo, hi) == check(lo, hi), (lo, hi)
            if check(lo, hi) and chance.random() < 0.5:
                native.take(lo, hi)
                reference.take(lo, hi)
            elif len(reference) and chance.random() < 0.3:
                start = chance.choice(reference.ranges())[0]
                native.release(start)
                reference.release(start)
            assert native.ranges() == reference.ranges()
        for lo, _ in reference.ranges():  # leave the arena as the plans left it
            native.release(lo)


def free_while_the_plans_run(native: bool) -> tuple[Any, ...]:
    """A served block freed while the plans hold their lock: the step's recording just after,
    blocks counted inside and after, and the report after one more step."""
    with learned(native=native) as steps:
        for number in range(3):
            with steps.step():
                run_step(number)
        kept: list[Any] = []
        with steps.step():
            live = run_step(3, keep=kept)
            served = steps.native_served
            with steps.plans._lock:  # the plans run: the server is paused
                inside = len(steps.plans._blocks)
                del kept[:]
                gc.collect()
                unbooked = len(steps.plans._blocks)
            recording = steps.plans._recorder.finish()  # as the server was left
            after = len(steps.plans)
            steps.plans._check_invariants()
            del live
        with steps.step():
            run_step(4)
        assert (steps.native_served > served) == native  # and the server goes on
        return recording, inside, unbooked, after, steps.report()


def test_a_free_while_the_plans_run_is_booked_before_the_server_goes_on(shim: Any) -> None:
    # Only logged while the plans run (a collection inside a call, another thread); leaving,
    # the plans book it before the server may serve again, at its place on the step's clock.
    recording, inside, unbooked, after, report = free_while_the_plans_run(True)
    assert unbooked == inside and after == inside - 1
    expected = free_while_the_plans_run(False)
    assert (recording, inside, after, report) == (expected[0], expected[1], *expected[3:])
    assert routed_blocks() == 0


def test_a_step_begun_natively_that_leaves_its_plan_in_the_key_is_booked_the_same(
        shim: Any) -> None:
    # Two patterns whose keys share their first size, alternating, then one repeating, with a
    # tensor kept now and then: the server serves a step's first allocation from the plan
    # served last, the other pattern's; the plans then choose as they would have (the step's
    # own plan, from its second allocation on). Native or not: the same report, the same bytes.
    other = (SIZES[0], 2048, *SIZES[2:])
    results = []
    for native in (True, False):
        with learned(ta.Counting(ta.HostMemory()), native=native) as steps:
            kept: list[Any] = []
            for number in range(14):
                sizes = other if number % 2 and number < 9 else SIZES
                with steps.step():
                    run_step(number, sizes, kept if number in (5, 11) else None, index=1)
                steps.plans._check_invariants()
            results.append((steps.report(), steps.statistics(),
                            [float(t[0]) for t in kept], steps.native_served))
            # never overwritten since its step
            assert all(torch.all(t == v) for t, v in zip(kept, results[-1][2], strict=True))
            kept.clear()
    (report, stats, values, served), expected = results[0], results[1]
    assert (report, stats, values) == expected[:3]
    made = report.allocations // 14
    assert report.plans_learned == 2 and report.served == 14 * made - report.fell_back
    assert served > 5 * made  # the repeating steps, keys included
    assert routed_blocks() == 0


def test_a_free_while_the_marker_is_at_work_is_booked_the_same(shim: Any) -> None:
    # A tensor of the step dies while the marker compares the step with its plan (a collection
    # there): logged in the step that ended, as the plans log their own blocks' frees then.
    results = []
    for native in (True, False):
        with learned(ta.Counting(ta.HostMemory()), native=native) as steps:
            held: list[Any] = []
            learn_again = steps.plans._plans.learn_again

            def dropping(*args: Any, held: list[Any] = held,
                         learn_again: Callable[..., None] = learn_again) -> None:
                held.clear()
                learn_again(*args)

            steps.plans._plans.learn_again = dropping  # type: ignore[method-assign]
            for number in range(8):
                with steps.step():
                    run_step(number, keep=held if number in (3, 4) else None)
                steps.plans._check_invariants()
            results.append((steps.report(), steps.statistics()))
            assert native == (steps.native_served > 0) and not held
    assert results[0] == results[1]
    assert routed_blocks() == 0
