"""Byte sizes as people write them: "8GiB", "512 MiB", "6GB", "1.5G".

Contract: `parse_size(text, what)` returns the bytes of a positive size (an int passes through;
K/M/G/T and KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024, a bare number or B
is bytes) and raises ValueError naming `what` ("not a size: ...", "size must be positive: ...").
`format_size(n)` writes bytes back with two decimals in the largest binary unit that fits.
Dependency-free (no torch, nothing of ours), so the budget planner, the profile settings and the
UI can all read sizes with it.
"""
from __future__ import annotations

import re

ANSWER_INDEX_BYTES_PER_TOKEN = 16   # assistant.runtime.history_lookup: token 4 B + sorted 3-gram key 8 B + position 4 B

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4, "tb": 1000**4, "tib": 1024**4}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """'8GiB', '512 MiB', '6GB', '1.5G', 1024 -> bytes (G/GB are 10^9, GiB 2^30). Raises ValueError."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"{what} must be positive: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a {what}: {text!r} (write e.g. 8GiB, 512MiB, 6GB)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"{what} must be positive: {text!r}")
    return n


def format_size(n: float) -> str:
    """Bytes -> '8.00 GiB', '512.00 MiB', '12 B' (negative values keep their sign)."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{sign}{n / k:.2f} {unit}"
    return f"{sign}{int(n)} B"
