"""A step's log kept in C++ (``NativeRecorder``) logs, finishes and compares exactly as the Python
``Recorder`` does, compares a step with a signature in C++ without making it, and refuses bad
input with an error, never a crash."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tensorarena.learned.native_recorder import NativeRecorder
from tensorarena.learned.recording import FinishedStep, Recorder

pytestmark = pytest.mark.torch


def fill(recorders: list[Recorder], seed: int, count: int = 60) -> None:
    """The same random allocations and frees, logged into every recorder."""
    rng = random.Random(seed)
    live: list[int] = []
    for _ in range(count):
        if live and rng.random() < 0.45:
            number = live.pop(rng.randrange(len(live)))
            for recorder in recorders:
                recorder.freed(number)
        else:
            nbytes, alignment = rng.choice((64, 128, 4096, 1 << 20)), rng.choice((16, 64))
            numbers = {recorder.allocated(nbytes, alignment) for recorder in recorders}
            assert len(numbers) == 1
            live.append(numbers.pop())


@pytest.mark.parametrize("seed", range(8))
def test_a_native_log_is_the_python_recorders(shim: Any, seed: int) -> None:
    python, native = Recorder(), NativeRecorder(shim)
    fill([python, native], seed)
    assert len(native) == len(python) and native.clock == python.clock
    assert native.signature() == python.signature()
    assert native.finish() == python.finish()
    n = len(python)
    assert native.finish(n // 3, 2 * n // 3, python.clock - 2) == python.finish(
        n // 3, 2 * n // 3, python.clock - 2)
    assert native.key(5) == python.key(5) and native.start_of(n - 1) == python.start_of(n - 1)


def test_a_step_is_compared_exactly_in_cpp(shim: Any) -> None:
    a, b = NativeRecorder(shim), NativeRecorder(shim)
    fill([a, b], seed=1)
    sizes, outlived = a.signature()
    assert a.matches((sizes, outlived)) and a.same(b) and b.same(a)
    assert a.matches((list(sizes), list(outlived)))  # any sequence of ints
    changed = ((*sizes[:-1], sizes[-1] + 1), outlived)
    assert not a.matches(changed)
    assert not a.matches((sizes[:-1], outlived)) and not a.matches(((*sizes, 64), outlived))
    assert not a.matches((sizes, outlived[:-1])) and not a.matches((sizes, (*outlived, 10**6)))
    assert not a.matches((sizes, (-1, *outlived)))
    b.freed(outlived[0])  # one block fewer outlives b
    assert not a.same(b) and not b.same(a)
    python = Recorder()
    fill([python], seed=1)
    assert a.same(python)  # a Python recorder is compared by its signature


def test_a_finished_native_step_makes_no_signature_unless_asked(shim: Any) -> None:
    a, b, python = NativeRecorder(shim), NativeRecorder(shim), Recorder()
    fill([a, b, python], seed=2)
    for recorder in (a, b):
        recorder.end(learned=True)
    step, other, expected = FinishedStep(a), FinishedStep(b), FinishedStep(python)
    assert step.has_signature(expected.signature) and step.same_as(other)
    assert step.same_as(expected)
    assert step._signature is None  # compared in C++: no Python tuple per allocation
    assert expected.same_as(step)
    assert step.key(3) == expected.key(3) and len(step) == len(expected)
    assert step.signature == expected.signature
    assert step.recording() == expected.recording()


def test_bad_input_raises_and_changes_nothing(shim: Any) -> None:
    native = NativeRecorder(shim)
    number = native.allocated(64, 16)
    native.freed(number)
    clock = native.clock
    with pytest.raises(IndexError):
        native.freed(number)  # freed twice
    with pytest.raises(IndexError):
        native.freed(5)  # never allocated
    with pytest.raises(OverflowError):
        native.freed(-1)
    with pytest.raises(TypeError):
        native.matches((("64",), ()))  # not an int
    with pytest.raises(TypeError):
        native.matches((64, ()))  # not a sequence
    with pytest.raises(ValueError):
        shim.step_log_length(object())  # not a log
    with pytest.raises(TypeError):
        shim.step_log_allocated(native.log, 64)
    assert native.clock == clock and native.signature() == ((64,), ())


def test_a_free_after_the_step_ended_is_not_logged_as_in_python(shim: Any) -> None:
    python, native = Recorder(), NativeRecorder(shim)
    fill([python, native], seed=3)
    outlived = python.signature()[1]
    for recorder in (python, native):
        recorder.end(learned=True)
        recorder.freed(outlived[0])  # the marker is at work: not logged
    assert native.signature() == python.signature() and native.clock == python.clock
    assert native.signature()[1] == outlived
