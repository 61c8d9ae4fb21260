"""A live array keeps its bytes: nothing a user calls unmaps them or hands them out again.

Each reproducer of issue 7 that used to crash the interpreter runs in a child process, so that a
regression is reported as a failed test (with the child's exit status), not as a dead test run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensorarena as ta
from tensorarena.errors import (
    InvalidArgumentError,
    InvalidDtypeError,
    InvalidResourceError,
    InvalidSizeError,
    NotHostAccessibleError,
    ResourceInUseError,
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; its exit status says whether it crashed."""
    script = "import numpy as np\nimport tensorarena as ta\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)


def _assert_ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"exit {done.returncode} (-11 is SIGSEGV): {done.stderr[-800:]}"
    assert done.stdout.strip().endswith("ok"), done.stdout


# --- close, with, reset, trim ---------------------------------------------------------------


def test_an_array_outlives_an_explicit_close() -> None:
    _assert_ok(_run("""
        host = ta.HostMemory()
        pool = ta.Pool(host)
        a = ta.zeros(100_000, resource=pool)
        pool.close()
        a[:] = 1                               # SIGSEGV before: the arena was unmapped
        assert a.sum() == 100_000 and len(host.live_blocks()) == 1
        del a                                  # the last block: now the arena goes back
        assert host.live_blocks() == {}
        print("ok")
    """))


def test_an_array_outlives_the_with_block_of_its_pool() -> None:
    _assert_ok(_run("""
        host = ta.HostMemory()
        with ta.Pool(host) as pool:
            a = ta.zeros(100_000, resource=pool)
        a[:] = 2
        assert a.sum() == 200_000
        try:
            ta.zeros(10, resource=pool)
        except ta.ResourceClosedError:
            pass
        else:
            raise SystemExit("a closed pool handed out memory")
        del a
        assert host.live_blocks() == {}
        print("ok")
    """))


def test_a_torch_view_outlives_the_pool() -> None:
    pytest.importorskip("torch")
    _assert_ok(_run("""
        pool = ta.Pool(ta.HostMemory())
        t = ta.zeros((64, 64), resource=pool, like="torch")
        view = t[1:, ::2]
        del t
        pool.close()
        view.fill_(3.0)
        assert float(view.sum()) == 3.0 * 63 * 32
        print("ok")
    """))


def test_reset_then_trim_with_a_live_array_is_refused() -> None:
    _assert_ok(_run("""
        pool = ta.Pool(ta.HostMemory())
        a = ta.zeros(100_000, resource=pool)
        try:
            pool.reset()
        except ta.ResourceInUseError as error:
            assert error.live_blocks == 1
        else:
            raise SystemExit("reset() freed a live array's block")
        assert pool.trim() == 0                # the arena holds a live block: kept
        a[:] = 1
        print("ok")
    """))


def test_reset_refusal_prevents_aliasing() -> None:
    pool = ta.Pool(ta.HostMemory())
    a = ta.zeros(1000, resource=pool)
    with pytest.raises(ResourceInUseError, match="1 block"):
        pool.reset()
    b = ta.zeros(1000, resource=pool)
    a[:] = 1
    b[:] = 2
    assert a.sum() == 1000 and b.sum() == 2000  # different bytes
    assert a.ctypes.data != b.ctypes.data


def test_a_thread_cache_holding_blocks_makes_the_pool_refuse_reset() -> None:
    """The documented hazard "flush before resetting the upstream" is enforced."""
    pool = ta.Pool(ta.HostMemory())
    cached = ta.ThreadCached(pool)
    cached.deallocate(cached.allocate(4096), 4096)  # now sits in this thread's cache
    with pytest.raises(ResourceInUseError, match="flush_all"):
        pool.reset()
    cached.flush_all()
    pool.reset()


# --- memory the CPU cannot touch ------------------------------------------------------------


@pytest.mark.parametrize(
    "resource",
    [
        pytest.param(lambda: ta.VirtualMemory(), id="virtual"),
        pytest.param(lambda: ta.Arena("1MiB", base=1 << 30), id="arena"),
        pytest.param(lambda: ta.Pool(ta.VirtualMemory()), id="pool-over-virtual"),
        pytest.param(lambda: ta.ThreadCached(ta.Pool(ta.VirtualMemory())), id="cached-virtual"),
    ],
)
def test_arrays_over_address_space_are_refused_before_any_allocation(resource: object) -> None:
    made = resource()  # type: ignore[operator]
    with pytest.raises(NotHostAccessibleError, match="addresses only"):
        ta.zeros(4, resource=made)
    with pytest.raises(NotHostAccessibleError):
        ta.set_default_resource(made)
    with pytest.raises(NotHostAccessibleError), ta.scope(made):
        pass
    stats = getattr(made, "statistics", None)
    if stats is not None and hasattr(stats(), "allocations"):
        assert stats().allocations.total == 0


def test_the_arena_reproducer_does_not_crash() -> None:
    done = _run("""
        try:
            ta.empty(10, resource=ta.Arena("1MiB", base=0x7F0000000000))
        except ta.NotHostAccessibleError:
            print("ok")
    """)
    _assert_ok(done)


def test_a_resource_that_declares_no_kind_is_refused_with_advice() -> None:
    class Undeclared:
        def allocate(self, nbytes: int, alignment: int = 256, stream: object = None) -> int:
            raise AssertionError("must not be reached")

        def deallocate(self, address: int, nbytes: int, stream: object = None) -> None:
            raise AssertionError("must not be reached")

    with pytest.raises(NotHostAccessibleError, match="memory_kind"):
        ta.empty(4, resource=Undeclared())  # type: ignore[arg-type]
    with pytest.raises(InvalidResourceError, match="call it"):
        ta.empty(4, resource=ta.HostMemory)  # type: ignore[arg-type]


# --- shapes and dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2**64, 0), (2**63, 0), 2**64, (1 << 40, 1 << 30)])
def test_absurd_shapes_are_size_errors(shape: object) -> None:
    with pytest.raises(InvalidSizeError):
        ta.empty(shape, np.uint8)  # type: ignore[arg-type]


def test_a_structured_dtype_with_padding_comes_back_as_itself() -> None:
    dtype = np.dtype(
        {"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 12}
    )
    host = ta.HostMemory()
    records = ta.zeros(3, dtype, resource=host)
    assert records.dtype == dtype and records.itemsize == 12
    records["b"] = [1, 2, 3]
    assert records["b"].tolist() == [1, 2, 3] and records["a"].tolist() == [0, 0, 0]
    del records
    assert host.live_blocks() == {}


@pytest.mark.parametrize("dtype", [object, "not-a-dtype", np.dtype("U"), "(2,)f4"])
def test_dtypes_raw_memory_cannot_hold_are_dtype_errors(dtype: object) -> None:
    with pytest.raises(InvalidDtypeError):
        ta.empty(4, dtype)


def test_an_unknown_array_kind_is_an_argument_error() -> None:
    with pytest.raises(InvalidArgumentError, match="like must be"):
        ta.empty(4, like="jax")  # type: ignore[arg-type]
