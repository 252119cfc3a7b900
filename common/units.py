"""Byte sizes as people type them, and back.

``parse_bytes`` reads ``"3000000"``, ``"3MB"``, ``"1.5MiB"``, ``"512 KiB"``,
``"3_000_000"``.  Decimal prefixes are decimal and binary ones are binary, as
SI and IEC define them (and as the POET paper and its reference graphs count
bytes, in plain decimal numbers)::

    B                 1
    kB / KB / k       1 000            KiB  1 024
    MB / M            1 000 000        MiB  1 048 576
    GB / G            1 000 000 000    GiB  1 073 741 824

So ``--memory 3MB`` is the reference budget of 3,000,000 bytes, not
3,145,728.  Case does not matter (``3mb`` is ``3MB``).  A fractional number of
bytes is rounded down: a budget must never grow by being written differently.
"""

from __future__ import annotations

import math
import re

_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse a size such as ``"3MB"`` or ``"1.5MiB"`` into whole bytes.

    Raises
    ------
    ValueError
        With a message naming the accepted forms, when ``text`` is not a size.
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, (int, float)):
        return _whole_bytes(float(text), str(text))
    if text.strip().startswith("-"):
        raise ValueError(f"{text!r} is negative: a size is a number of bytes >= 0 (3000000, 3MB, 1.5MiB)")
    match = _SIZE.match(text)
    unit = match.group(3).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: write bytes (3000000) or a number with a unit "
            "(3MB = 3,000,000; 1.5MiB = 1,572,864; units B, kB, MB, GB, KiB, MiB, GiB)")
    number = float(match.group(1).replace("_", "") + (f"e{match.group(2)}" if match.group(2) else ""))
    return _whole_bytes(number * _UNITS[unit], text)


def _whole_bytes(value: float, text: str) -> int:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a size: it must be a finite, non-negative number of bytes")
    # Round down, with a hair of slack so that 0.3 * 10**6 (299999.99999999994) stays 300000.
    return int(math.floor(value * (1 + 1e-12)))


def format_bytes(n: float | None) -> str:
    """``3000000`` -> ``"3,000,000 B (3.00 MB)"``: exact bytes first, then a readable decimal size."""
    if n is None:
        return "unconstrained"
    n = int(n)
    return f"{n:,} B" if abs(n) < 1000 else f"{n:,} B ({short_bytes(n)})"


def short_bytes(n: float) -> str:
    """A short decimal size for tables and plot labels: ``"3.00 MB"``, ``"850 kB"``, ``"12 B"``."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(n) >= scale:
            value = n / scale
            digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{int(n)} B"
