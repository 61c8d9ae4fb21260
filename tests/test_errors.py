"""The exception tree: who derives from what, and what each error says and carries."""

from __future__ import annotations

import pytest

from tensorarena import errors
from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidProblemError,
    MissingDependencyError,
    OutOfMemoryError,
    SizeMismatchError,
    TensorArenaError,
)


@pytest.mark.parametrize(
    ("cls", "bases"),
    [
        (errors.InvalidSizeError, (TensorArenaError, ValueError)),
        (errors.InvalidAlignmentError, (TensorArenaError, ValueError)),
        (OutOfMemoryError, (TensorArenaError, MemoryError)),
        (InvalidAddressError, (TensorArenaError, ValueError)),
        (DoubleFreeError, (InvalidAddressError,)),
        (SizeMismatchError, (InvalidAddressError,)),
        (InvalidProblemError, (TensorArenaError, ValueError)),
        (errors.InvalidPlanError, (TensorArenaError,)),
        (errors.InfeasibleError, (TensorArenaError,)),
        (MissingDependencyError, (TensorArenaError, ImportError)),
        (errors.TensorArenaWarning, (UserWarning,)),
    ],
)
def test_hierarchy(cls: type, bases: tuple[type, ...]) -> None:
    assert all(issubclass(cls, base) for base in bases)


def test_every_exported_name_exists() -> None:
    for name in errors.__all__:
        assert isinstance(getattr(errors, name), type)


def test_out_of_memory_exhaustion() -> None:
    error = OutOfMemoryError(4096, free=1024, largest_free=1024, capacity=8192, allocated=7168)
    assert not error.is_fragmentation
    text = str(error)
    assert "exhaustion" in text and "4 KiB" in text and "4096 bytes" in text
    assert "largest free extent 1 KiB" in text and "capacity 8 KiB" in text
    assert "allocated 7 KiB" in text
    assert (error.requested, error.free, error.largest_free, error.capacity) == (
        4096, 1024, 1024, 8192
    )


def test_out_of_memory_fragmentation() -> None:
    error = OutOfMemoryError(4096, free=6000, largest_free=2048, capacity=8192, detail="why")
    assert error.is_fragmentation
    assert "fragmentation" in str(error) and str(error).endswith("why")


def test_out_of_memory_over_a_limit() -> None:
    error = OutOfMemoryError(
        4096, free=1 << 20, largest_free=1 << 20, capacity=1 << 20, limit=8192, allocated=6000,
        reserved=8192,
    )
    assert "over the limit of 8 KiB" in str(error) and "reserved 8 KiB" in str(error)


def test_address_errors_carry_their_numbers() -> None:
    error = SizeMismatchError("no", address=0x100, given=5, allocated=6)
    assert (error.address, error.given, error.allocated) == (0x100, 5, 6)
    assert DoubleFreeError("twice", address=7).address == 7


def test_invalid_problem_locates_the_fault() -> None:
    assert str(InvalidProblemError("bad size", line=3, column="size")) == (
        "line 3, column 'size': bad size"
    )
    assert str(InvalidProblemError("empty")) == "empty"
    assert InvalidProblemError("x", line=2).line == 2


def test_missing_dependency_names_the_extra() -> None:
    error = MissingDependencyError("torch", "torch", "tracing a model")
    assert "pip install 'tensorarena[torch]'" in str(error)
    assert (error.module, error.extra) == ("torch", "torch")
