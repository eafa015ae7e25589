"""Numbers for the status line: process memory and sizes (an answer's statistics are
assistant.types.AnswerStats).

Contract: `rss_bytes()` reads the resident set size from /proc (or `resource`
where /proc is absent) without psutil or torch; `gpu_bytes()` asks torch only when
it is already imported. `parse_bytes` / `format_bytes` convert sizes such as
"8GiB". Pure, no Textual.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Any


def rss_bytes() -> int | None:
    """Resident memory of this process in bytes (None if it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return None


def gpu_bytes() -> int | None:
    """CUDA memory allocated by torch, only if torch is already imported and on a GPU."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.memory_allocated())
    except Exception:  # noqa: BLE001 - a status line must never fail
        return None
    return None


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_bytes(value: Any) -> int | None:
    """8589934592, "8GiB", "8 GB", "512MiB" -> bytes; None for None/unknown."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value) if value > 0 else None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
