"""Workspace: the block planned programs share, checked when it is made."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensorarena.errors import InvalidArgumentError, InvalidResourceError  # noqa: E402
from tensorarena.runtime import Workspace  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_workspace_refuses_a_wrong_device_or_resource_when_made_not_at_first_use() -> None:
    with pytest.raises(InvalidArgumentError, match="'cpu' or 'cuda:N', not 'gpu'"):
        Workspace(device="gpu")
    with pytest.raises(InvalidResourceError, match="not str"):
        Workspace("256MiB")  # type: ignore[arg-type]


def test_a_workspace_reserves_and_grows_its_block() -> None:
    workspace = Workspace()
    assert workspace.reserve(100).numel() == 100 and workspace.generation == 1
    assert workspace.reserve(50).numel() == 100 and workspace.generation == 1
    assert workspace.reserve(200).numel() == 200 and workspace.generation == 2


def test_growing_replaces_the_block_instead_of_adding_one() -> None:
    from tensorarena.memory import HostMemory, Pool, Segments

    mib = 1024 * 1024
    pool = Pool(HostMemory(), growth=Segments(), initial_size=0)
    workspace = Workspace(pool)
    assert workspace.reserve(3 * mib).numel() == 4 * mib  # whole 2 MiB granules
    assert pool.statistics().reserved_bytes.current == 4 * mib  # an exact fit
    assert workspace.reserve(4 * mib).numel() == 4 * mib and workspace.generation == 1
    grown = workspace.reserve(4 * mib + 1)
    assert grown.numel() == 6 * mib
    grown[-1] = 7  # the new block is whole
    # the old block went back before the new one was taken, and its arena, empty then, went
    # back too, not kept beside the new one
    assert pool.statistics().reserved_bytes.peak == 6 * mib
    assert pool.statistics().reserved_bytes.current == 6 * mib
    assert workspace.generation == 2 and pool.statistics().allocations.current == 1
    assert workspace.reserve(mib - 1).numel() == 6 * mib  # never shrinks


def test_a_failed_growth_leaves_the_workspace_empty_and_the_old_block_to_its_holders() -> None:
    from tensorarena.errors import OutOfMemoryError
    from tensorarena.memory import HostMemory, Pool

    pool = Pool(HostMemory(), initial_size=1024 * 1024, maximum_size=1024 * 1024)
    workspace = Workspace(pool)
    block = workspace.reserve(1000)
    block[:] = 3
    with pytest.raises(OutOfMemoryError):
        workspace.reserve(2 * 1024 * 1024)
    assert workspace.nbytes == 0 and workspace.generation == 2  # code over the old block is stale
    assert int(block.sum()) == 3000  # a tensor over the old block keeps it
    assert workspace.reserve(1000).numel() == 1000 and workspace.generation == 3


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


linux_only = pytest.mark.skipif(not __import__("sys").platform.startswith("linux"),
                                reason="madvise and /proc/self: Linux")


@linux_only
def test_an_idle_block_gives_its_pages_back_and_keeps_its_address() -> None:
    from tensorarena.memory import HostMemory, Pool

    pool = Pool(HostMemory(), initial_size=0)
    workspace = Workspace(pool)
    block = workspace.reserve(32 * 2**20)
    block.fill_(3)
    before, address = _resident_mib(), block.data_ptr()
    assert workspace.release_idle_pages() == 32 * 2**20  # whole granules: every page
    assert before - _resident_mib() > 28
    assert workspace.memory.data_ptr() == address and workspace.generation == 1
    assert not workspace.memory.any()  # its pages come back zeroed at the next touch
    assert pool.statistics().reserved_bytes.current == 32 * 2**20  # still the pool's block


@linux_only
def test_a_workspace_in_use_keeps_its_pages() -> None:
    import threading

    workspace = Workspace()
    workspace.reserve(4096).fill_(5)
    with workspace.use():  # this thread's call
        assert workspace.release_idle_pages() == 0
    entered, leave = threading.Event(), threading.Event()

    def call() -> None:
        with workspace.use():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert entered.wait(10)
        assert workspace.release_idle_pages() == 0  # another thread's call
    finally:
        leave.set()
        thread.join()
    assert (workspace.memory == 5).all()


def test_an_empty_workspace_releases_nothing() -> None:
    assert Workspace().release_idle_pages() == 0


class _Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
        self.out = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(torch.nn.functional.gelu(self.up(x))) + x
        return self.out(torch.tanh(y)) * y


def whole_pages(block: torch.Tensor) -> torch.Tensor:
    """The bytes of ``block`` on pages it has to itself (what goes back: a block of a pool
    may share its first and last pages with others)."""
    from tensorarena.memory.idle_pages import PAGE

    address = block.data_ptr()
    start = -(-address // PAGE) * PAGE - address
    end = (address + block.numel()) // PAGE * PAGE - address
    assert end - start >= PAGE  # the test means something
    return block[start:end]


def arena_blocks(program: object) -> list[torch.Tensor]:
    """The blocks of ``outputs="arena"`` the program's one shape keeps."""
    current = next(iter(program.compiler.cache.values()))  # type: ignore[attr-defined]
    return [arena.memory for arena in current.arenas._arenas]


@linux_only
@pytest.mark.parametrize("outputs", ["handover", "fresh", "arena"])
def test_a_program_runs_the_same_after_its_idle_pages_went_back(outputs: str) -> None:
    import tensorarena as ta
    from tensorarena.runtime import PlannedProgram

    torch.manual_seed(0)
    model = _Residual().eval()
    x = torch.randn(32, 64)
    program = PlannedProgram.from_module(model, (x,), outputs=outputs)
    program(x)  # the first call records kernels' allocations and plans again
    first = program(x)
    kept = first.clone()
    held = program.workspace.memory if outputs != "arena" else arena_blocks(program)[0]
    assert held.any()  # the call's intermediates are still there
    ta.empty_cache()
    assert torch.equal(first, kept)  # what the caller holds keeps its bytes
    if outputs != "arena":
        assert not whole_pages(held).any()
    else:  # the block ``first`` holds keeps its bytes; an idle one gives them back
        assert whole_pages(held).any()
        del first
        ta.empty_cache()
        assert not whole_pages(held).any()
    third = program(x)
    assert torch.equal(third, kept)
    if outputs == "handover":  # the tail the caller dropped goes back too
        tail = next(iter(program.compiler.cache.values())).generated.run.__self__  # type: ignore[attr-defined]
        held = tail.current
        assert tail.idle_blocks() == []  # ``third`` holds it
        ta.empty_cache()
        assert torch.equal(third, kept)
        del third
        assert whole_pages(held).any()
        ta.empty_cache()
        assert held is tail.current and not whole_pages(held).any()
        assert torch.equal(program(x), kept)


@linux_only
def test_empty_cache_gives_back_the_workspaces_over_the_resource_it_empties() -> None:
    import tensorarena as ta
    from tensorarena.memory import HostMemory, Pool

    mine, other = Pool(HostMemory(), initial_size=0), Pool(HostMemory(), initial_size=0)
    workspace, default = Workspace(mine), Workspace()
    block, elsewhere = workspace.reserve(2 * 2**20), default.reserve(2 * 2**20)
    block.fill_(9)
    elsewhere.fill_(9)
    ta.empty_cache(other)
    assert (block == 9).all() and (elsewhere == 9).all()
    ta.empty_cache(ta.Limiting(mine, "1GiB"))  # mine is in its stack
    assert not whole_pages(block).any() and (elsewhere == 9).all()
    ta.empty_cache()  # the default resource's
    assert not whole_pages(elsewhere).any()


@linux_only
def test_a_call_waits_for_a_page_release_even_where_it_refuses_to_wait_for_a_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from tensorarena.runtime import workspace as module

    inside, slow = threading.Event(), module.release_idle_pages

    def slow_release(address: int, nbytes: int) -> int:
        inside.set()
        time.sleep(0.3)
        return slow(address, nbytes)

    monkeypatch.setattr(module, "release_idle_pages", slow_release)
    workspace = Workspace(concurrency="refuse")
    workspace.reserve(2 * 2**20).fill_(1)
    released: list[int] = []
    thread = threading.Thread(target=lambda: released.append(workspace.release_idle_pages()))
    thread.start()
    try:
        assert inside.wait(10)
        started = time.perf_counter()
        with workspace.use():  # no ConcurrentUseError: the release is no call
            assert time.perf_counter() - started > 0.1  # it waited for the release
    finally:
        thread.join()
    assert released == [2 * 2**20]
