"""Values at the API edge: sizes, alignments and addresses become exact ``int`` here, once.

Everything below the API edge speaks exact Python ``int``: bytes, alignments and addresses. Each
concept has one function that turns what a user may pass into that int or raises a specific
:class:`~tensorarena.errors.TensorArenaError` naming the value, and every resource, adaptor and
planner calls the same one (hot paths keep a one-line test for the common exact-int case and
call the function for everything else):

* :func:`check_nbytes` — a request's byte count: an ``int``, an integer-like (``np.int64``:
  anything with ``__index__``) or a size string, in ``(0, MAX_SIZE]``;
* :func:`check_alignment` — a positive power of two up to ``MAX_SIZE``, same types minus strings;
* :func:`check_address` — an ``int`` or integer-like, non-negative. Floats, ``Decimal`` and
  strings are refused: ``1234.0`` hashes like ``1234`` and would find a live block, then carry a
  float into every strategy's free lists;
* :func:`parse_size` — configuration sizes (capacities, limits), which may be zero when allowed.

The size-string rule, everywhere (pools, planners, the command line): binary units ``KiB``,
``MiB``, ``GiB``, ``TiB`` and the bare letters ``K``, ``M``, ``G``, ``T`` are powers of 1024;
decimal units ``kB``, ``MB``, ``GB``, ``TB`` are powers of 1000 (so ``"1MB"`` is 1,000,000 bytes,
less than ``"1MiB"``); case does not matter; fractions must come out a whole number of bytes.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable

from tensorarena.errors import (
    InvalidAddressError,
    InvalidAlignmentError,
    InvalidSizeError,
    TensorArenaError,
)

__all__ = [
    "ALIGNMENTS",
    "INTEGER_TEXT",
    "MAX_SIZE",
    "SIZE_RULE",
    "Size",
    "align_up",
    "check_address",
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
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$", re.ASCII)
_SIGNED_RE = re.compile(r"^\s*-\s*(\d+(?:\.\d*)?|\.\d+)\s*[a-zA-Z]*\s*$", re.ASCII)

#: What a number in a text file may look like: an optional sign and ASCII digits, blanks around.
#: ``int()`` alone also takes ``"١٢"`` (Arabic-Indic), ``"１２"`` (fullwidth) and ``"1_000"``;
#: the CSV readers (problems, traces) refuse those with this pattern.
INTEGER_TEXT = re.compile(r"^\s*[+-]?[0-9]+\s*$", re.ASCII)

#: Sizes above this are refused outright: no machine has 2**60 bytes (1 EiB).
MAX_SIZE = 1 << 60
# Digits in a size string: 2**60 has 19; more than this cannot be a size (and int() of a
# 4300-digit string raises a bare ValueError).
_MAX_DIGITS = 40

#: The size-string rule in one line, for ``--help`` texts and error messages.
SIZE_RULE = (
    "sizes are bytes or a number with a unit: KiB/MiB/GiB/TiB (and K/M/G/T) are powers of "
    "1024, kB/MB/GB/TB powers of 1000"
)


def parse_size(value: Size, *, name: str = "size", allow_zero: bool = False) -> int:
    """Return ``value`` (an int, a NumPy integer or a size string) as a byte count; raise
    :class:`InvalidSizeError` naming ``name`` if bad.

    Decimal units (``kB``, ``MB``, ``GB``) are powers of 1000, binary units (``KiB``, ``MiB``,
    ``GiB``) and bare letters (``K``, ``M``, ``G``) powers of 1024. Fractions must come out whole.
    """
    if isinstance(value, bool):
        raise InvalidSizeError(f"{name} must be an int or a size string, not a bool ({value!r})")
    value = _as_index(value, InvalidSizeError, name)  # type: ignore[assignment]
    if isinstance(value, int):
        nbytes = int(value)
    elif isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2).lower() if match else ""
        if match is None and _SIGNED_RE.match(value):
            raise InvalidSizeError(f"{name} must be {_expected(allow_zero)}, got {value!r}")
        if match is None or unit not in _UNITS:
            raise InvalidSizeError(
                f"{name} {_shown(value)} does not parse: expected a number with an optional unit "
                f"such as '4096', '64KiB', '256MiB', '1.5GB' ({SIZE_RULE})"
            )
        number = match.group(1)
        if len(number) > _MAX_DIGITS:
            raise InvalidSizeError(
                f"{name} {_shown(value)} is absurdly large (over {MAX_SIZE} bytes)"
            )
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
        raise InvalidSizeError(f"{name} must be {_expected(allow_zero)}, got {_shown(value)}")
    if nbytes > MAX_SIZE:
        raise InvalidSizeError(
            f"{name} {_shown(value)} is absurdly large (over {MAX_SIZE} bytes)"
        )
    return nbytes


def _expected(allow_zero: bool) -> str:
    return "non-negative" if allow_zero else "positive"


def _shown(value: object) -> str:
    """``repr(value)``, shortened: a message must not carry a 5000-digit number."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 4000 else "<huge int>"
    return text if len(text) <= 60 else text[:40] + "..." + text[-10:]


def _as_index(value: object, error: Callable[[str], TensorArenaError], name: str) -> object:
    """An integer-like value (a NumPy integer, say) as an exact ``int``; anything else unchanged.

    ``__index__`` is the test (PEP 357): integers and integer-likes have it, floats, ``Decimal``
    and fractions do not. ``bool`` has it too and is left for the caller to refuse. An
    ``__index__`` that raises anything but ``TypeError`` raises ``error(message)`` naming
    ``name``, the original chained.
    """
    if type(value) is int or isinstance(value, (bool, str)):
        return value
    if hasattr(type(value), "__index__"):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            return value
        except Exception as exc:
            raise error(f"{name}: {type(value).__name__}.__index__ raised "
                        f"{type(exc).__name__}: {exc}") from exc
    return value


def check_nbytes(value: object, *, name: str = "nbytes") -> int:
    """A request's byte count as an ``int`` in ``(0, MAX_SIZE]``, else :class:`InvalidSizeError`.

    Accepts ints, integer-likes (NumPy integers) and size strings. Allocators keep their own
    one-line fast test for a plain in-range ``int`` and call this for everything else, so every
    resource accepts and refuses the same values with the same messages.
    """
    return parse_size(value, name=name)  # type: ignore[arg-type]


def check_request(nbytes: object, alignment: object) -> tuple[int, int]:
    """Validate an allocation request; return ``(nbytes, alignment)`` as ints."""
    return check_nbytes(nbytes), check_alignment(alignment)


def check_alignment(alignment: object, *, name: str = "alignment") -> int:
    """Return ``alignment`` as an ``int`` if it is a positive power of two up to ``MAX_SIZE``."""
    alignment = _as_index(alignment, InvalidAlignmentError, name)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise InvalidAlignmentError(
            f"{name} must be a positive power of two, got {_shown(alignment)}"
        )
    if alignment > MAX_SIZE:
        raise InvalidAlignmentError(
            f"{name} must be a positive power of two up to {MAX_SIZE} (1 EiB), "
            f"got {_shown(alignment)}"
        )
    return alignment


#: Every valid alignment: hot paths test ``type(a) is int and a in ALIGNMENTS`` in one lookup.
ALIGNMENTS = frozenset(1 << k for k in range(MAX_SIZE.bit_length()))


def _address_error(message: str) -> InvalidAddressError:
    return InvalidAddressError(message, address=-1)


def check_address(address: object, *, name: str = "address") -> int:
    """Return ``address`` as an exact non-negative ``int``, else raise InvalidAddressError.

    Integer-likes (``np.int64``, anything with ``__index__``) are converted; floats, ``Decimal``,
    strings and ``bool`` are refused, so nothing but an exact int reaches the bookkeeping.
    """
    if type(address) is int and address >= 0:
        return address
    converted = _as_index(address, _address_error, name)
    if type(converted) is not int:
        raise InvalidAddressError(
            f"{name} must be an int, not {type(address).__name__} ({_shown(address)})",
            address=-1,
        )
    if converted < 0:
        raise InvalidAddressError(f"{name} must be non-negative, got {converted}", address=-1)
    return converted


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
