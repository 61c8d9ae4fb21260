"""The errors an :class:`~tensorarena.core.arena.Arena` raises, built off its hot paths.

Each builder takes the values it reports (never the arena), so a message says exactly what the
arena knew when it refused: a size out of range, an alignment its base cannot honour, a free of
the wrong size, a request no free extent holds, an address that is not live (a double free when
it is among the recent frees). The arena raises what they return; none of them changes state.
"""

from __future__ import annotations

from typing import Any

from tensorarena.errors import (
    DoubleFreeError,
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    OutOfMemoryError,
    SizeMismatchError,
)
from tensorarena.sizes import check_alignment, check_nbytes, parse_size

__all__ = [
    "check_free_size",
    "checked_alignment",
    "not_live_error",
    "out_of_memory_error",
    "size_error",
]


def size_error(nbytes: int) -> InvalidSizeError:
    """The error ``parse_size`` raises for an int size out of range."""
    try:
        parse_size(nbytes, name="nbytes")
    except InvalidSizeError as error:
        return error
    raise AssertionError(f"{nbytes} is a valid size")  # pragma: no cover - callers checked


def checked_alignment(alignment: object, base: int, base_alignment: int) -> int:
    """Validate an alignment the fast path did not recognise; return it as an int."""
    checked = check_alignment(alignment)
    if checked > base_alignment:
        raise InvalidAlignmentError(
            f"alignment {checked} exceeds the alignment of the arena's base address {base:#x}"
        )
    return checked


def check_free_size(address: int, requested: int, nbytes: object) -> None:
    """Raise unless ``nbytes`` (given to ``deallocate``) names the block's requested size."""
    given = check_nbytes(nbytes)
    if given != requested:
        raise SizeMismatchError(
            f"block at {address:#x} was allocated with {requested} bytes, "
            f"deallocated with {nbytes!r}",
            address=address,
            given=given,
            allocated=requested,
        )


def out_of_memory_error(
    nbytes: int,
    alignment: int,
    strategy: Any,
    *,
    capacity: int,
    allocated: int,
    initial_free: int,
) -> OutOfMemoryError:
    """The error for a request of a valid size that ``strategy`` found no room for."""
    reserved = (nbytes + alignment - 1) & -alignment
    largest_free = strategy.largest_free()
    detail = ""
    if reserved > nbytes and reserved > largest_free >= nbytes:
        detail = (
            f"alignment {alignment} rounds the request up to {reserved} bytes, more than "
            "the largest free extent"
        )
    elif reserved <= largest_free:
        detail = (
            f"no free extent holds {reserved} bytes at alignment {alignment} "
            f"(the strategy's placement rules leave no room for it)"
        )
    return OutOfMemoryError(
        nbytes,
        free=strategy.free_bytes(),
        largest_free=largest_free,
        capacity=capacity,
        allocated=allocated,
        reserved=initial_free - strategy.free_bytes(),
        detail=detail,
    )


def not_live_error(
    address: int, recent_frees: list[int | None], remembered: int, base: int, capacity: int
) -> InvalidAddressError:
    """The error for ``address``, which is not live: a double free if it is among
    ``recent_frees`` (the arena's ring of its last ``remembered`` frees), else an address never
    allocated here (or freed long ago)."""
    if address in recent_frees:  # not live, so freed recently
        return DoubleFreeError(
            f"double free: block at {address:#x} was already freed (or released by reset())",
            address=address,
        )
    where = "inside" if base <= address < base + capacity else "outside"
    return InvalidAddressError(
        f"address {address:#x} is not live in this arena: never allocated here, or freed "
        f"long ago (before the last {remembered} frees); {where} its region "
        f"[{base:#x}, {base + capacity:#x})",
        address=address,
    )
