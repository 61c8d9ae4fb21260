"""Byte sizes at the API edge: parsing, formatting, alignment checks."""

from __future__ import annotations

import decimal
import fractions

import numpy as np
import pytest

from tensorarena.errors import InvalidAddressError, InvalidAlignmentError, InvalidSizeError
from tensorarena.sizes import (
    MAX_SIZE,
    align_up,
    check_address,
    check_alignment,
    check_nbytes,
    format_size,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        (4096, 4096),
        ("4096", 4096),
        ("256MiB", 256 << 20),
        ("256 MiB", 256 << 20),
        ("  64kib ", 64 << 10),
        ("1.5GB", 1_500_000_000),
        ("1.5GiB", 3 << 29),
        ("2k", 2048),
        ("2kB", 2000),
        ("1T", 1 << 40),
        ("1TB", 10**12),
        ("0.5KiB", 512),
        (".5MiB", 512 << 10),
        ("10b", 10),
        ("1.", 1),
    ],
)
def test_parse_size(text: int | str, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "1.5", "0.3KB7", "10XB", "1e3", "-5", "- 5", "5 M iB", "0x10", 0, -1, True, 1.0,
     None, [1], "2EiB", MAX_SIZE + 1, "2000000TiB"],
)
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(InvalidSizeError):
        parse_size(bad)  # type: ignore[arg-type]


def test_parse_size_names_the_argument_and_allows_zero_on_request() -> None:
    with pytest.raises(InvalidSizeError, match="capacity"):
        parse_size("lots", name="capacity")
    assert parse_size(0, allow_zero=True) == 0
    assert parse_size("0B", allow_zero=True) == 0
    assert parse_size(MAX_SIZE) == MAX_SIZE
    with pytest.raises(InvalidSizeError, match="non-negative"):
        parse_size(-1, allow_zero=True)


def test_fractions_must_come_out_whole() -> None:
    assert parse_size("1.25KiB") == 1280
    with pytest.raises(InvalidSizeError, match="whole"):
        parse_size("1.1B")


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (256 << 20, "256 MiB"),
        (3 << 30, "3 GiB"),
        (5 << 40, "5 TiB"),
        (-2048, "-2 KiB"),
    ],
)
def test_format_size(nbytes: int, text: str) -> None:
    assert format_size(nbytes) == text


@pytest.mark.parametrize("alignment", [1, 2, 256, 4096, 1 << 40])
def test_check_alignment_accepts_powers_of_two(alignment: int) -> None:
    assert check_alignment(alignment) == alignment


@pytest.mark.parametrize("alignment", [0, -4, 3, 12, 1.0, "8", None, True, 1 << 61])
def test_check_alignment_rejects(alignment: object) -> None:
    with pytest.raises(InvalidAlignmentError, match="power of two"):
        check_alignment(alignment)


def test_align_up() -> None:
    assert [align_up(n, 256) for n in (0, 1, 255, 256, 257)] == [0, 256, 256, 256, 512]
    assert align_up(5, 1) == 5


# --- one request check for every allocator ------------------------------------------------


def test_check_nbytes_accepts_integer_likes_and_strings() -> None:
    import numpy as np

    from tensorarena.sizes import check_nbytes, check_request

    assert check_nbytes(np.int64(4096)) == 4096
    assert type(check_nbytes(np.uint32(8))) is int
    assert check_nbytes("4KiB") == 4096
    assert check_request(np.int64(100), np.int64(64)) == (100, 64)
    for bad in (0, -1, True, 1.5, None, 1 << 61):
        with pytest.raises(InvalidSizeError):
            check_nbytes(bad)


def test_every_allocator_accepts_and_refuses_the_same_sizes() -> None:
    import numpy as np

    from tensorarena import Arena, Limiting, Pool, VirtualMemory

    allocators = [
        Arena("1MiB"),
        Pool(VirtualMemory(), initial_size="1MiB"),
        Limiting(VirtualMemory(), "1MiB"),
        VirtualMemory(),
    ]
    for allocator in allocators:
        address = allocator.allocate(np.int64(4096), np.int64(256))
        allocator.deallocate(address, 4096)
        for bad in (0, -5, True, "lots"):
            with pytest.raises(InvalidSizeError):
                allocator.allocate(bad)
        with pytest.raises(InvalidAlignmentError):
            allocator.allocate(64, 3)


# --- one input rule: each concept normalised once, by one function -------------------------


@pytest.mark.parametrize("value", [0, 1, 4096, 1 << 47, np.int64(4096), np.uint32(7)])
def test_check_address_accepts_ints_and_integer_likes_as_exact_ints(value: object) -> None:
    address = check_address(value)
    assert type(address) is int and address == int(value)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "value", [4096.0, decimal.Decimal(4096), fractions.Fraction(4096), "4096", None, True, -1,
              np.float64(4096), [4096]]
)
def test_check_address_refuses_everything_else(value: object) -> None:
    with pytest.raises(InvalidAddressError):
        check_address(value)


def test_check_nbytes_takes_integer_likes_and_strings() -> None:
    assert check_nbytes(np.int64(5)) == 5 and type(check_nbytes(np.int64(5))) is int
    assert check_nbytes("1KiB") == 1024
    for bad in (1024.0, decimal.Decimal(1024), np.float32(8), True):
        with pytest.raises(InvalidSizeError):
            check_nbytes(bad)


def test_a_huge_digit_string_is_a_size_error_not_a_bare_value_error() -> None:
    # int() refuses strings over 4300 digits with a bare ValueError (CVE-2020-10735).
    with pytest.raises(InvalidSizeError, match="absurdly large") as info:
        parse_size("9" * 5000)
    assert len(str(info.value)) < 300  # the message does not carry the 5000 digits


def test_a_negative_size_string_says_negative() -> None:
    with pytest.raises(InvalidSizeError, match=r"must be positive, got '-5'"):
        parse_size("-5")
    with pytest.raises(InvalidSizeError, match=r"must be non-negative, got '-1 MiB'"):
        parse_size("-1 MiB", allow_zero=True)


def test_the_size_rule_is_stated_in_unparseable_errors() -> None:
    with pytest.raises(InvalidSizeError, match=r"powers of 1024.*powers of 1000"):
        parse_size("12 parsecs")
    assert parse_size("1MB") == 1_000_000 and parse_size("1M") == parse_size("1MiB") == 1 << 20


def test_parse_size_takes_numpy_integers_as_ints_and_nothing_else_of_numpys() -> None:
    assert parse_size(np.int64(4096)) == 4096
    assert parse_size(np.uint64(1 << 60)) == 1 << 60  # exactly the largest size
    with pytest.raises(InvalidSizeError, match="absurdly large"):
        parse_size(np.uint64((1 << 60) + 1))
    assert parse_size(np.int32(0), allow_zero=True) == 0
    with pytest.raises(InvalidSizeError, match="positive"):
        parse_size(np.int32(0))
    with pytest.raises(InvalidSizeError, match="positive"):
        parse_size(np.int64(-1))
    for bad in (np.float64(4096.0), np.bool_(True), np.array([4096])):
        with pytest.raises(InvalidSizeError, match="int or a size string"):
            parse_size(bad)


class _IndexRaises:
    """An integer-like whose ``__index__`` fails with something other than ``TypeError``."""

    def __index__(self) -> int:
        raise ValueError("no index today")


def test_an_index_that_raises_is_our_error_with_the_original_chained() -> None:
    for check, error in ((parse_size, InvalidSizeError), (check_nbytes, InvalidSizeError),
                         (check_alignment, InvalidAlignmentError),
                         (check_address, InvalidAddressError)):
        with pytest.raises(error, match="no index today") as info:
            check(_IndexRaises())  # type: ignore[arg-type]
        assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("text", ["١٢", "１２KiB", "4٠96", "1.５MiB", "-１"])
def test_sizes_are_ascii_digits_only(text: str) -> None:
    with pytest.raises(InvalidSizeError):
        parse_size(text)
