"""Byte sizes as users type them (--chunk-size, --cache-size) and as tables print them."""

from __future__ import annotations

import re

import pytest

from fanfs._sizes import format_size, parse_size
from fanfs.errors import UsageError

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("0", 0),
        ("4MiB", 4 * MiB),
        ("4mib", 4 * MiB),
        ("4 MiB", 4 * MiB),
        ("  64KiB  ", 64 * KiB),
        ("512k", 512 * KiB),  # single letters are binary, as in dd
        ("512K", 512 * KiB),
        ("1m", MiB),
        ("2g", 2 * GiB),
        ("1t", TiB),
        ("1.5G", 3 * GiB // 2),
        ("0.5k", 512),
        ("1kb", 1000),  # two-letter SI units are decimal
        ("4MB", 4_000_000),
        ("3gb", 3_000_000_000),
        ("2TB", 2 * 10**12),
        ("10b", 10),
        ("10B", 10),
        ("1GiB", GiB),
        ("1TiB", TiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_large_integers_are_exact() -> None:
    # Integers must not go through a float: 2**53 + 1 is not representable as one.
    assert parse_size("9007199254740993") == 9007199254740993
    assert parse_size("9007199254740993b") == 9007199254740993


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "abc",
        "MiB",
        "-1",
        "-4MiB",
        "4x",
        "4 XiB",
        "4 M iB",
        "1e6",
        "4,096",
        "0x10",
        "1..5k",
        "4MiB4",
    ],
)
def test_parse_size_rejects(text: str) -> None:
    expected = "invalid size %r (expected a number with an optional unit such as 4MiB)" % text
    with pytest.raises(UsageError, match="^%s$" % re.escape(expected)):
        parse_size(text)


def test_parse_size_absurdly_large_is_a_usage_error() -> None:
    # Too big for a float: must still be a one-line UsageError (or an exact int), never
    # an OverflowError that the CLI would print as a traceback.
    text = "9" * 400
    try:
        value = parse_size(text)
    except UsageError:
        return
    assert value == int(text)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (10 * KiB, "10.0 KiB"),
        (MiB, "1.0 MiB"),
        (int(2.5 * MiB), "2.5 MiB"),
        (GiB, "1.0 GiB"),
        (TiB, "1.0 TiB"),
        (1024 * TiB, "1024.0 TiB"),  # TiB is the largest unit
        (-2048, "-2.0 KiB"),
        (1023.9, "1023 B"),
    ],
)
def test_format_size(size: float, expected: str) -> None:
    assert format_size(size) == expected


@pytest.mark.parametrize(
    ("size", "expected"),
    [(MiB - 1, "1.0 MiB"), (GiB - 1, "1.0 GiB")],
)
def test_format_size_rounds_into_the_next_unit(size: float, expected: str) -> None:
    # Just below a unit boundary the value rounds to 1024.0 of the smaller unit; a table
    # should say "1.0 MiB", never "1024.0 KiB".
    assert format_size(size) == expected


@pytest.mark.parametrize("size", [0, 1, 1000, 4096, 4 * MiB, 3 * GiB // 2, 5 * TiB])
def test_format_then_parse_is_close(size: int) -> None:
    text = format_size(size).replace(" ", "")
    assert abs(parse_size(text) - size) <= max(1, size * 0.05)
