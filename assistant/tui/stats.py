"""Numbers for the status line: per-answer decoding statistics and process memory.

Contract: `TurnStats.add(step)` accumulates one decoding step (tokens, drafted
tokens, seconds, passes) and records the character span of the step's text,
marked "banked" when any of its tokens came from accepted speculation
(`step.drafted > 0`). `tok_per_s`, `tokens_per_pass` and `accepted_rate`
(drafted / total tokens) derive from it; `to_dict()` is what is stored with the
message and `from_dict()` restores it. `rss_bytes()` reads the resident set size
from /proc (or `resource` where /proc is absent) without psutil or torch.
`parse_bytes` / `format_bytes` convert sizes such as "8GiB". Pure, no Textual.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from assistant.tui.protocol import StepLike


@dataclass
class TurnStats:
    tokens: int = 0
    drafted: int = 0
    passes: int = 0
    seconds: float = 0.0
    chars: int = 0
    finish: str | None = None
    banked: list[tuple[int, int]] = field(default_factory=list)  # [start, end) char spans

    def add(self, step: StepLike) -> None:
        n = len(step.tokens)
        self.tokens += n
        self.drafted += min(max(int(step.drafted), 0), n)
        self.passes += 1
        self.seconds += float(step.seconds or 0.0)
        start, self.chars = self.chars, self.chars + len(step.text)
        if step.drafted > 0 and self.chars > start:
            if self.banked and self.banked[-1][1] == start:
                self.banked[-1] = (self.banked[-1][0], self.chars)
            else:
                self.banked.append((start, self.chars))
        if step.finish:
            self.finish = step.finish

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def accepted_rate(self) -> float:
        return self.drafted / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "drafted": self.drafted, "passes": self.passes,
                "seconds": round(self.seconds, 4), "finish": self.finish,
                "tok_per_s": round(self.tok_per_s, 2), "tokens_per_pass": round(self.tokens_per_pass, 3),
                "banked": [list(s) for s in self.banked]}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, text: str = "") -> "TurnStats":
        d = d or {}
        spans = []
        for s in d.get("banked") or []:
            try:
                a, b = int(s[0]), int(s[1])
            except (TypeError, ValueError, IndexError):
                continue
            if 0 <= a < b <= len(text):
                spans.append((a, b))
        return cls(tokens=int(d.get("tokens") or 0), drafted=int(d.get("drafted") or 0),
                   passes=int(d.get("passes") or 0), seconds=float(d.get("seconds") or 0.0),
                   chars=len(text), finish=d.get("finish"), banked=spans)


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
