"""Byte sizes at the API edge: parse ``"256MiB"``/``"1.5GB"``, format for humans, check alignment.

Everything below the API edge speaks plain ``int`` bytes; this is the one place strings become ints.
"""

from __future__ import annotations

import operator
import re

from tensorarena.errors import InvalidAlignmentError, InvalidSizeError

__all__ = [
    "Size",
    "align_up",
    "check_alignment",
    "check_nbytes",
    "check_request",
    "format_size",
    "parse_size",
]

Size = int | str
"""A byte count: an ``int``, or a string such as ``"4096"``, ``"256MiB"``, ``"1.5GB"``."""

_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")

#: Sizes above this are refused outright: no machine has 2**60 bytes (1 EiB).
MAX_SIZE = 1 << 60


def parse_size(value: Size, *, name: str = "size", allow_zero: bool = False) -> int:
    """Return ``value`` as a byte count; raise :class:`InvalidSizeError` naming ``name`` if bad.

    Decimal units (``kB``, ``MB``, ``GB``) are powers of 1000, binary units (``KiB``, ``MiB``,
    ``GiB``) and bare letters (``K``, ``M``, ``G``) powers of 1024. Fractions must come out whole.
    """
    if isinstance(value, bool):
        raise InvalidSizeError(f"{name} must be an int or a size string, not a bool ({value!r})")
    if isinstance(value, int):
        nbytes = value
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise InvalidSizeError(
                f"{name} {value!r} does not parse: expected a number with an optional unit "
                "such as '4096', '64KiB', '256MiB', '1.5GB'"
            )
        number = match.group(1)
        scale = _UNITS[unit]
        if "." in number:
            whole, _, frac = number.partition(".")
            numerator = int(whole or "0") * 10 ** len(frac) + int(frac or "0")
            nbytes, remainder = divmod(numerator * scale, 10 ** len(frac))
            if remainder:
                raise InvalidSizeError(f"{name} {value!r} is not a whole number of bytes")
        else:
            nbytes = int(number) * scale
    else:
        raise InvalidSizeError(
            f"{name} must be an int or a size string, not {type(value).__name__} ({value!r})"
        )
    if nbytes < 0 or (nbytes == 0 and not allow_zero):
        expected = "non-negative" if allow_zero else "positive"
        raise InvalidSizeError(f"{name} must be {expected}, got {value!r}")
    if nbytes > MAX_SIZE:
        raise InvalidSizeError(f"{name} {value!r} is absurdly large (over {MAX_SIZE} bytes)")
    return nbytes


def _as_index(value: object) -> object:
    """An integer-like value (a NumPy integer, say) as an ``int``; anything else unchanged."""
    is_int_like = not isinstance(value, (bool, str)) and hasattr(value, "__index__")
    if type(value) is not int and is_int_like:
        return operator.index(value)  # type: ignore[arg-type]
    return value


def check_nbytes(value: object, *, name: str = "nbytes") -> int:
    """A request's byte count as an ``int`` in ``(0, MAX_SIZE]``, else :class:`InvalidSizeError`.

    Accepts ints, integer-likes (NumPy integers) and size strings. Allocators keep their own
    one-line fast test for a plain in-range ``int`` and call this for everything else, so every
    resource accepts and refuses the same values with the same messages.
    """
    return parse_size(_as_index(value), name=name)  # type: ignore[arg-type]


def check_request(nbytes: object, alignment: object) -> tuple[int, int]:
    """Validate an allocation request; return ``(nbytes, alignment)`` as ints."""
    return check_nbytes(nbytes), check_alignment(alignment)


def check_alignment(alignment: object, *, name: str = "alignment") -> int:
    """Return ``alignment`` as an ``int`` if it is a positive power of two, else raise."""
    alignment = _as_index(alignment)
    if (
        type(alignment) is not int
        or alignment <= 0
        or alignment & (alignment - 1)
        or alignment > MAX_SIZE
    ):
        raise InvalidAlignmentError(f"{name} must be a positive power of two, got {alignment!r}")
    return alignment


def align_up(value: int, alignment: int) -> int:
    """Round ``value`` up to a multiple of the power-of-two ``alignment``."""
    return (value + alignment - 1) & -alignment


def format_size(nbytes: int) -> str:
    """Format a byte count for humans in binary units: ``1536`` → ``'1.5 KiB'``."""
    sign = "-" if nbytes < 0 else ""
    value = float(abs(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.3g} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
