"""LearnedPlans on real memory: a step repeated, changed in one place, reordered, kept, failed;
patterns alternating and over the bound; threads; every bad call. Every block's bytes carry a
pattern checked after each call (tests/learned/_memory.py), so an aliased slot fails at once."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from _memory import Bytes

import tensorarena as ta
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidArgumentError,
    InvalidSizeError,
    ResourceClosedError,
    SizeMismatchError,
)
from tensorarena.learned import FallbackReason, LearnedPlans
from tensorarena.memory.host import HostMemory

# A step: a chain of temporaries, each freed after the next is made; 8 allocations.
STEP = [("a", 4096), ("a", 8192), ("f", 0), ("a", 2048), ("f", 1), ("a", 16384), ("f", 2),
        ("a", 1024), ("a", 512), ("f", 3), ("a", 4096), ("f", 4), ("f", 5), ("a", 8192),
        ("f", 6), ("f", 7)]
N = sum(op == "a" for op, _ in STEP)


def _plans(**options: object) -> LearnedPlans:
    return LearnedPlans(HostMemory(), **options)  # type: ignore[arg-type]


def _step(bytes_: Bytes, program: list[tuple[str, int]] = STEP) -> list[int]:
    addresses = bytes_.run(program)
    bytes_.plans.step()
    return addresses


def test_an_exact_repeat_is_served_from_one_arena_at_the_lower_bound() -> None:
    plans = _plans()
    b = Bytes(plans)
    _step(b)
    first = plans.report()
    assert first.served == 0 and first.unknown_pattern == N and first.plans_learned == 1
    second, third = _step(b), _step(b)
    assert second == third  # the same slots every step
    report = plans.report()
    assert report.served == 2 * N and report.fell_back == N and report.steps == 3
    (summary,) = report.plans
    assert summary.height == summary.lower_bound and summary.optimal
    # The first step's pool went back: only the arena is held.
    assert report.reserved_bytes == report.arena_bytes == summary.height
    assert report.steady_peak_reserved_bytes == summary.height


def test_one_size_differs_in_the_middle() -> None:
    plans = _plans()
    b = Bytes(plans)
    _step(b)
    changed = [(op, 3000 if (op, value) == ("a", 512) else value) for op, value in STEP]
    _step(b, changed)
    report = plans.report()
    assert report.size_mismatch == 1 and report.served == N - 1
    _step(b)  # the recorded step again: all served
    assert plans.report().served == 2 * N - 1


def test_an_order_swap_is_served_out_of_order_or_falls_back_never_aliased() -> None:
    plans = _plans()
    b = Bytes(plans)
    _step(b)
    swapped = list(STEP)
    swapped[7], swapped[8] = swapped[8], swapped[7]  # 512 before 1024
    _step(b, swapped)
    report = plans.report()
    assert report.served + report.fell_back == 2 * N
    assert report.served_out_of_order >= 1 and report.served >= N - 2
    _step(b)
    assert plans.report().served >= 2 * N - 2


def test_a_block_kept_past_its_step_is_never_aliased() -> None:
    plans = _plans()
    b = Bytes(plans)
    _step(b)
    kept_program = [item for item in STEP if item != ("f", 5)]  # keep the 16 KiB block
    addresses = _step(b, kept_program)
    kept = addresses[5]
    assert kept in b.live
    for _ in range(3):  # its slot is occupied from now on: those steps fall back there
        _step(b)
        b.check()
    assert plans.report().slot_occupied >= 3
    b.free(kept)
    _step(b)
    b.check()


def test_a_block_that_outlived_its_recording_falls_back() -> None:
    plans = _plans()
    b = Bytes(plans)
    kept_program = [item for item in STEP if item != ("f", 5)]
    kept = _step(b, kept_program)[5]
    _step(b, kept_program)  # kept is freed after this step: the step is served by the plan
    b.free(kept)
    report = plans.report()
    assert report.outlived_recording == 1 and report.served == N - 1


def test_blocks_carried_into_the_next_step_get_slots_once_the_step_repeats() -> None:
    # A training loop: the "gradients" (the two blocks made last) outlive the step and the
    # next step frees them first, as zero_grad does. The first plan has no slot for them: the
    # second step, which freed them before it allocated, is served by the pool (not the first
    # plan's arena beside its new gradients), and the first step is planned again from a cut
    # after those frees; from the third step on every block is served.
    plans = _plans()
    b = Bytes(plans)
    grads: list[int] = []
    for _ in range(5):
        for address in grads:
            b.free(address)
        addresses = b.run([*STEP, ("a", 20_000), ("a", 30_000)])
        grads = addresses[-2:]
        plans.step()
        b.check()
    report = plans.report()
    (plan,) = report.plans
    assert plan.planned == plan.allocations == N + 2 and plan.optimal
    assert report.outlived_recording == 0 and report.plans_learned == 2
    assert report.carried_blocks == N + 2  # step 2
    assert report.served == 3 * (N + 2)
    # Steady state: one arena, the height of the plan, nothing in the pool.
    assert report.reserved_bytes - report.arena_bytes == 0
    for address in grads:
        b.free(address)
    assert plans.report().reserved_bytes == report.arena_bytes


def test_blocks_carried_but_freed_after_the_first_allocation_are_served_beside() -> None:
    # The boundary of the rule above: the next step allocates once before it frees the
    # gradients, so the first plan serves it (its arena is taken by then), the gradients fall
    # back beside it, and the pattern is planned again cyclically at its marker.
    plans = _plans()
    b = Bytes(plans)
    grads: list[int] = []
    for _ in range(2):
        first = b.alloc(4096)
        for address in grads:
            b.free(address)
        addresses = b.run([*STEP, ("a", 20_000), ("a", 30_000)])
        b.free(first)
        grads = addresses[-2:]
        plans.step()
        b.check()
    report = plans.report()
    assert report.carried_blocks == 0 and report.plans_learned == 2
    assert report.outlived_recording == 2 and report.served == N + 1  # all but the grads
    for address in grads:
        b.free(address)


def test_a_block_live_across_the_cut_keeps_its_slot_when_the_carried_blocks_are_held() -> None:
    # zero_grad between the forward and the backward pass: an "activation" lives across the
    # last free of the carried "gradients", so a window rotated there has no slot for it (and
    # the pool would hold it beside an arena as large as the gradients and the late temporary).
    # The window at the marker, the gradients held all step, places everything at the live
    # peak: it is the plan kept.
    plans = _plans()
    b = Bytes(plans)
    grads: list[int] = []
    for _ in range(5):
        activation = b.alloc(61_440)
        for address in grads:
            b.free(address)
        grads = [b.alloc(20_480), b.alloc(30_720)]
        b.free(activation)
        b.free(b.alloc(61_440))
        plans.step()
        b.check()
    report = plans.report()
    assert report.outlived_recording == 2  # step 2's gradients; nothing from step 3 on
    assert report.served == 2 + 3 * 4
    (plan,) = report.plans
    assert plan.planned == plan.allocations and plan.height == plan.lower_bound == 112_640
    assert report.reserved_bytes == report.arena_bytes == 112_640
    for address in grads:
        b.free(address)


def test_a_carried_block_kept_longer_than_planned_is_not_aliased() -> None:
    plans = _plans()
    b = Bytes(plans)
    grads: list[int] = []
    kept: list[int] = []
    for k in range(6):
        for address in grads:
            if k == 4 and not kept:
                kept.append(address)  # this one is not freed by the next step: kept past it
                continue
            b.free(address)
        grads = b.run([*STEP, ("a", 20_000), ("a", 30_000)])[-2:]
        plans.step()
        b.check()
    assert plans.report().slot_occupied >= 1
    for address in [*grads, *kept]:
        b.free(address)
    b.check()


def test_a_step_that_raises_halfway_leaves_the_next_step_correct() -> None:
    plans = _plans()
    b = Bytes(plans)
    with plans.step_scope():
        b.run(STEP)
    with pytest.raises(RuntimeError), plans.step_scope():
        addresses = b.run(STEP[:6])
        for address in addresses:
            if address in b.live:
                b.free(address)
        raise RuntimeError("the step failed")
    learned = plans.report().plans_learned
    with plans.step_scope():
        b.run(STEP)
    report = plans.report()
    assert report.plans_learned == learned  # nothing learned from the failed step
    assert report.steps == 2 and report.served >= N


def test_two_patterns_alternating_each_get_a_plan() -> None:
    plans = _plans()
    b = Bytes(plans)
    other = [("a", 777), ("a", 999), ("f", 0), ("a", 333), ("f", 1), ("f", 2)]
    for _ in range(4):
        _step(b)
        _step(b, other)
    report = plans.report()
    assert report.plans_learned == 2 and len(report.plans) == 2
    assert report.served == 3 * (N + 3)


def test_more_patterns_than_the_bound_evict_the_least_recently_used() -> None:
    plans = _plans(max_patterns=2)
    b = Bytes(plans)
    patterns = [[("a", 1000 + k), ("a", 64), ("f", 0), ("f", 1)] for k in range(3)]
    for _ in range(3):
        for program in patterns:
            _step(b, program)
    report = plans.report()
    assert len(report.plans) == 2 and report.plans_evicted >= 1
    assert report.served + report.fell_back == report.allocations
    assert report.arena_bytes <= sum(p.height for p in report.plans)  # arenas are taken lazily
    assert report.served > 0  # a pattern is learned over a plan only once it recurs


def test_an_evicted_arena_stays_until_its_last_block_is_freed() -> None:
    plans = _plans(max_patterns=1)
    b = Bytes(plans)
    first = [("a", 1000), ("a", 64), ("f", 1)]
    _step(b, [*first, ("f", 0)])
    kept = _step(b, first)[0]  # served from the plan's arena, and kept
    _step(b, [("a", 5000), ("f", 0)])
    _step(b, [("a", 5000), ("f", 0)])  # a new pattern evicts the first plan
    assert plans.report().plans_evicted >= 1
    b.check()  # the kept block's bytes are still its own
    before = plans.report().arena_bytes
    b.free(kept)
    assert plans.report().arena_bytes < before


def test_threads_allocating_concurrently() -> None:
    plans = _plans()
    b = Bytes(plans)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine: list[int] = []
        try:
            for _ in range(60):
                if mine and rng.random() < 0.5:
                    address = mine.pop(int(rng.integers(len(mine))))
                    with lock:
                        b.free(address)
                else:
                    nbytes = int(rng.integers(1, 5000))
                    with lock:  # the pattern write, not the allocation, needs the lock
                        mine.append(b.alloc(nbytes))
            for address in mine:
                with lock:
                    b.free(address)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for _ in range(3):
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        plans.step()
    assert not errors
    assert not b.live and len(plans) == 0
    plans._check_invariants()


def test_concurrent_allocations_without_a_caller_lock() -> None:
    plans = _plans()
    for _ in range(3):
        addresses: list[list[tuple[int, int]]] = [[] for _ in range(4)]

        def work(k: int, addresses: list[list[tuple[int, int]]] = addresses) -> None:
            for i in range(50):
                addresses[k].append((plans.allocate(64 * (i % 7 + 1)), 64 * (i % 7 + 1)))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        blocks = sorted(a for chunk in addresses for a in chunk)
        for (a, n), (c, _) in itertools.pairwise(blocks):
            assert a + n <= c  # no two live blocks share a byte
        for chunk in addresses:
            for address, nbytes in chunk:
                plans.deallocate(address, nbytes)
        plans.step()
    assert len(plans) == 0


def test_double_free_foreign_address_and_size_mismatch_change_nothing() -> None:
    plans = _plans()
    b = Bytes(plans)
    _step(b)
    served = plans.allocate(4096)  # from the arena
    assert plans.report().served == 1
    pooled = plans.allocate(123_456)  # no slot of that size: from the pool
    plans.deallocate(served, 4096)
    plans.deallocate(pooled, 123_456)
    before, live = plans.report(), plans.live_blocks()
    with pytest.raises(DoubleFreeError):
        plans.deallocate(served, 4096)
    with pytest.raises(DoubleFreeError):
        plans.deallocate(pooled, 123_456)
    with pytest.raises(InvalidAddressError):
        plans.deallocate(0x1000, 64)
    with pytest.raises(InvalidAddressError):
        plans.deallocate("nowhere", 64)  # type: ignore[arg-type]
    kept = plans.allocate(8192)
    with pytest.raises(SizeMismatchError):
        plans.deallocate(kept, 8191)
    plans.deallocate(kept, 8192)
    after = plans.report()
    assert after.allocations == before.allocations + 1 and plans.live_blocks() == live
    plans._check_invariants()


@pytest.mark.parametrize("nbytes", [0, -1, "lots"])
def test_a_bad_size_is_refused_and_changes_nothing(nbytes: object) -> None:
    plans = _plans()
    before = plans.report()
    with pytest.raises(InvalidSizeError):
        plans.allocate(nbytes)  # type: ignore[arg-type]
    assert plans.report() == before


def test_an_alignment_larger_than_the_plans_falls_back_aligned() -> None:
    plans = _plans()
    b = Bytes(plans)
    program = [("a", 256), ("a", 256), ("f", 0), ("f", 1)]
    _step(b, program)
    first = b.alloc(256)
    second = b.alloc(256, alignment=1 << 16)  # a slot 256 bytes in cannot be 64 KiB aligned
    assert second % (1 << 16) == 0
    report = plans.report()
    assert report.alignment == 1 and report.served == 1
    b.free(first)
    b.free(second)
    with pytest.raises(InvalidAlignmentError):
        plans.allocate(64, alignment=3)


def test_a_first_step_with_lasting_state_is_relearned_from_the_steady_steps() -> None:
    plans = _plans()
    b = Bytes(plans)
    state = [("a", 100_000), ("a", 100_000)]  # made by the first step only, and kept
    first = b.run(state + [(op, value + 2 if op == "f" else value) for op, value in STEP])
    plans.step()
    for _ in range(3):
        _step(b)
    assert plans.report().plans_learned == 2  # the steady step replaced the first
    served = plans.report().served
    _step(b)
    assert plans.report().served == served + N
    for address in first[:2]:
        b.free(address)


def test_markers_do_nothing_without_allocations_and_refuse_a_bad_flag() -> None:
    plans = _plans()
    plans.step()
    plans.step()
    assert plans.report().steps == 0
    with pytest.raises(InvalidArgumentError):
        plans.step(failed="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        LearnedPlans(HostMemory(), max_patterns=0)
    with pytest.raises(InvalidArgumentError):
        LearnedPlans(HostMemory(), detect_steps=True).step()


def test_close_refuses_new_requests_and_frees_still_work() -> None:
    plans = _plans()
    b = Bytes(plans)
    _step(b)
    kept = b.alloc(4096)
    plans.close()
    with pytest.raises(ResourceClosedError):
        plans.allocate(64)
    b.check()
    b.free(kept)
    assert plans.report().reserved_bytes == 0


def test_arrays_over_the_resource() -> None:
    plans = _plans()
    for step in range(3):
        with plans.step_scope():
            x = ta.empty((64, 64), np.float32, resource=plans)
            x[:] = step
            y = ta.empty((64, 64), np.float32, resource=plans)
            np.matmul(x, x, out=y)
            z = ta.empty(10, np.int64, resource=plans)
            z[:] = 7
            assert (y == 64 * step * step).all() and (z == 7).all()
            del x, y, z
    report = plans.report()
    assert report.served == 6 and report.fell_back == 3
    assert repr(plans).startswith("LearnedPlans(")
    stats = plans.statistics()
    assert stats.requested_bytes.current == 0 and stats.reserved_bytes.current > 0
    assert report.fallbacks()[FallbackReason.UNKNOWN_PATTERN] == 3


def test_an_allocation_the_pool_refuses_leaves_the_step_where_it_was() -> None:
    from tensorarena.adaptors import Limiting
    from tensorarena.errors import OutOfMemoryError

    plans = LearnedPlans(Limiting(HostMemory(), "1MiB"))
    b = Bytes(plans)
    _step(b)
    with pytest.raises(OutOfMemoryError):
        plans.allocate(4 << 20)  # no slot of that size: the pool asks the upstream, refused
    _step(b)  # the step goes on as if it had not been asked: every allocation served
    assert plans.report().served == N


def test_a_cursor_on_a_plan_whose_arena_went_back_falls_back() -> None:
    from tensorarena.learned.recording import RecordedAllocation, StepRecording
    from tensorarena.learned.step_plan import StepCursor, StepPlan

    recording = StepRecording((RecordedAllocation(64, 64, 0, 1),
                               RecordedAllocation(64, 64, 2, 3)), 4)
    plan = StepPlan(recording, key_length=4, node_limit=100)
    plan.base = 1 << 20
    cursor = StepCursor(plan, 0, lookahead=4)
    assert cursor.match(64, 64) == (0, False)
    plan.base = None  # retired and given back while a step still pointed at it
    assert cursor.match(64, 64) is FallbackReason.NO_ARENA


@pytest.mark.parametrize(("planned_between", "found"), [(4, True), (5, False)])
def test_matching_ahead_passes_over_positions_without_a_slot_uncounted(
        planned_between: int, found: bool) -> None:
    from tensorarena.learned.recording import RecordedAllocation, StepRecording
    from tensorarena.learned.step_plan import StepCursor, StepPlan

    # A 32-byte allocation, ``planned_between`` planned 64-byte ones, ten that outlived the
    # recording (no slot: passed over free), then the 128-byte one a later step asks for next.
    allocations = [RecordedAllocation(32, 64, 0, 1)]
    allocations += [RecordedAllocation(64, 64, 2 + 2 * i, 3 + 2 * i)
                    for i in range(planned_between)]
    clock = 2 + 2 * planned_between
    allocations += [RecordedAllocation(16, 64, clock + i, None) for i in range(10)]
    allocations.append(RecordedAllocation(128, 64, clock + 10, clock + 11))
    plan = StepPlan(StepRecording(tuple(allocations), clock + 12), key_length=1, node_limit=100)
    plan.base = 1 << 20
    cursor = StepCursor(plan, 0, lookahead=4)
    assert cursor.match(32, 64) == (0, False)
    last = len(allocations) - 1
    # Up to ``lookahead`` slots ahead (the cursor's own, which did not match, and three more
    # jumped over): the planned ones in between count, the ten without a slot do not.
    assert cursor.match(128, 64) == ((last, True) if found else FallbackReason.ORDER_MISMATCH)
    if found:  # the planned slots jumped over stay findable
        assert cursor.match(64, 64) == (1, True)
