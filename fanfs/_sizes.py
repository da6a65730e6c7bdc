"""Parse and format byte sizes ("4MiB", "1.5G", "4096") for options and tables."""

from __future__ import annotations

import re

from fanfs.errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Return the number of bytes in `text` ("4MiB", "512k", "1.5G", "4096").

    Single-letter units are binary (k = KiB), as in `dd` and most HPC tools.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS or len(match.group(1)) > 30:
        raise UsageError(
            "invalid size %r (expected a number with an optional unit such as 4MiB)" % text
        )
    # Exact arithmetic: a float would round large byte counts.
    whole, _, frac = match.group(1).partition(".")
    value = int(whole + frac) * _UNITS[unit] // 10 ** len(frac)
    if value >= 2**63:
        raise UsageError("size %r is too large" % text)
    return value


def format_size(size: float) -> str:
    """Format a byte count for humans with binary units ("1.5 GiB")."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        # Compare after rounding, so 1048575 bytes is "1.0 MiB", not "1024.0 KiB".
        if abs(round(size, 1)) < 1024 or unit == "TiB":
            return ("%d %s" % (size, unit)) if unit == "B" else ("%.1f %s" % (size, unit))
        size /= 1024
    raise AssertionError("unreachable")
