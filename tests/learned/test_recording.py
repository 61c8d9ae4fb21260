"""A step's recorder at its marker: the signature made from the recorder equals the finished
recording's (frees at every tick, blocks outliving the step, frees booked from elsewhere), and a
step that repeats its plan is compared, never recorded again, while one that differs the same
way twice is still re-learned."""

from __future__ import annotations

import pytest
from _memory import Bytes

from tensorarena.learned import LearnedPlans
from tensorarena.learned.recording import FinishedStep, Recorder
from tensorarena.memory.host import HostMemory

STEP = [("a", 4096), ("a", 8192), ("f", 0), ("a", 2048), ("f", 1), ("a", 1024), ("f", 2),
        ("f", 3)]
N = sum(op == "a" for op, _ in STEP)


def test_a_recorders_signature_is_its_finished_recordings() -> None:
    recorder = Recorder()
    assert recorder.signature() == recorder.finish().signature() == ((), ())
    first = recorder.allocated(64, 16)
    recorder.allocated(128, 16)  # outlives the step
    recorder.freed(first)  # freed on the last tick so far
    recorder.allocated(256, 16)
    recorder.freed(recorder.allocated(64, 16))
    expected = ((64, 128, 256, 64), (1, 2))
    assert recorder.signature() == recorder.finish().signature() == expected
    last = recorder.allocated(32, 16)
    recorder.freed(last)  # freed on the recording's last tick: not outlived
    assert recorder.signature() == recorder.finish().signature() == (
        (64, 128, 256, 64, 32), (1, 2))


def test_a_finished_step_makes_its_recording_once_with_the_same_signature() -> None:
    recorder = Recorder()
    for nbytes in (64, 128, 64):
        recorder.allocated(nbytes, 16)
    recorder.freed(0)
    step = FinishedStep(recorder)
    assert len(step) == 3 and step.key(2) == (64, 128)
    recording = step.recording()
    assert step.recording() is recording
    assert recording.signature() == step.signature == ((64, 128, 64), (1, 2))


def _counting_finish(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    finish = Recorder.finish

    def counted(self: Recorder, *args: int | None) -> object:
        calls.append(len(self))
        return finish(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Recorder, "finish", counted)
    return calls


def test_a_repeated_step_is_compared_not_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_finish(monkeypatch)
    plans = LearnedPlans(HostMemory())
    b = Bytes(plans)
    for _ in range(5):
        b.run(STEP)
        plans.step()
    assert calls == [N]  # the first step only: it was learned from
    report = plans.report()
    assert report.served == 4 * N and report.steps == 5 and report.plans_learned == 1


def test_a_step_that_keeps_a_block_twice_is_relearned(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_finish(monkeypatch)
    plans = LearnedPlans(HostMemory())
    b = Bytes(plans)
    b.run(STEP)
    plans.step()
    kept = [item for item in STEP if item != ("f", 3)]  # same sizes, the last block outlives
    addresses = []
    for _ in range(2):
        addresses.append(b.run(kept)[3])
        plans.step()
    assert plans.report().plans_learned == 2 and calls == [N, N]  # learned on the second
    b.run(kept)  # served by the new plan: the kept block has no slot
    plans.step()
    assert plans.report().plans_learned == 2 and calls == [N, N]
    for address in addresses:
        b.free(address)
    b.check()


def test_a_free_after_the_step_ended_is_not_logged() -> None:
    # While the marker is at work (a collection frees a block there), the step has ended: the
    # block outlived it, in its recording as in its signature.
    recorder = Recorder()
    kept = recorder.allocated(64, 16)
    recorder.freed(recorder.allocated(128, 16))
    recorder.end(learned=True)
    step = FinishedStep(recorder)
    clock = recorder.clock
    recorder.freed(kept)
    assert recorder.clock == clock
    assert step.signature == step.recording().signature() == ((64, 128), (0,))
