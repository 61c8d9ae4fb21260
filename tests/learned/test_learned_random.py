"""Seeded random programs on LearnedPlans over real memory: steps that repeat, mutate, keep
blocks, raise, change alignment, with and without markers. Every live block's bytes carry their
own pattern and the invariants are checked after every call (tests/learned/_memory.py)."""

from __future__ import annotations

import random

import pytest
from _memory import Bytes

from tensorarena.learned import LearnedPlans
from tensorarena.memory.host import HostMemory

ALIGNMENTS = (64, 256, 4096, 1 << 16)


def _program(rng: random.Random, count: int) -> list[tuple[int, int, int]]:
    """(nbytes, alignment, frees after it) steps: each allocation, then some frees."""
    return [(rng.choice((64, 256, 1000, 4096, 20_000, 70_000)), rng.choice(ALIGNMENTS[:2]),
             rng.randrange(3)) for _ in range(count)]


def _mutate(rng: random.Random, program: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    program = list(program)
    kind = rng.randrange(5)
    i = rng.randrange(len(program))
    if kind == 0:
        program[i] = (program[i][0] + 8, *program[i][1:])  # a size differs
    elif kind == 1 and i + 1 < len(program):
        program[i], program[i + 1] = program[i + 1], program[i]  # an order swap
    elif kind == 2:
        program.insert(i, (512, 64, 1))  # an extra allocation
    elif kind == 3:
        program[i] = (program[i][0], rng.choice(ALIGNMENTS), program[i][2])  # alignment
    return program  # kind 4: the same step


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("detect", [False, True])
def test_random_steps_never_alias_and_keep_their_counts(seed: int, detect: bool) -> None:
    rng = random.Random(seed)
    plans = LearnedPlans(HostMemory(), max_patterns=2, detect_steps=detect)
    b = Bytes(plans)
    patterns = [_program(rng, rng.randrange(4, 14)) for _ in range(3)]
    kept: list[int] = []
    for _ in range(24):
        program = _mutate(rng, rng.choice(patterns)) if rng.random() < 0.4 else \
            rng.choice(patterns[:2])
        live: list[int] = []
        for nbytes, alignment, frees in program:
            live.append(b.alloc(nbytes, alignment))
            for _ in range(min(frees, len(live) - 1)):
                b.free(live.pop(rng.randrange(len(live) - 1)))
        if rng.random() < 0.2 and live:
            kept.append(live.pop())  # a block kept past its step
        if rng.random() < 0.3 and kept:
            b.free(kept.pop(0))
        for address in live:
            b.free(address)
        if not detect:
            plans.step(failed=rng.random() < 0.1)
        b.check()
    for address in kept:
        b.free(address)
    report = plans.report()
    assert report.served + report.fell_back == report.allocations
    assert len(report.plans) <= 2 and len(plans) == 0
    plans.close()
    assert plans.report().reserved_bytes == 0
