"""The status line: load progress, then speed, speculation and memory numbers.

Contract: `status_text(...)` (pure) formats one line from the session's `info()`
dict, the last answer's `TurnStats`, and memory in use against the budget:
"23.4 tok/s · 2.31 tok/pass · 38% accepted · mem 812.0 MiB / 8.0 GiB · SmolLM2 ·
cpu · fp32 · head …", most useful first since a narrow terminal cuts the end.
While the model loads it shows the stage and percent. `StatusLine.refresh_status`
renders it; the app calls it after each step and on a timer (memory).
"""
from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual.widgets import Static

from tui.stats import TurnStats, format_bytes


def _head_text(head: Any) -> str:
    if not isinstance(head, dict) or not head:
        return ""
    name = head.get("name") or head.get("version") or head.get("head") or head.get("drafter") or "?"
    name = str(name)
    if "/" in name:
        name = name.rstrip("/").rsplit("/", 1)[-1]
    params = head.get("parameters") or head.get("params")
    rows = head.get("rows") or head.get("vocab_size")
    extra = []
    if params:
        extra.append(f"{int(params) / 1e6:.2f}M params" if int(params) >= 100_000 else f"{int(params)} params")
    if rows:
        extra.append(f"{rows} rows")
    return f"head {name}" + (f" ({', '.join(extra)})" if extra else "")


def status_text(info: dict[str, Any] | None, stats: TurnStats | None, *, loading: str | None = None,
                rss: int | None = None, gpu: int | None = None, budget: int | None = None) -> str:
    parts: list[str] = []
    if loading is not None:
        parts.append(f"[b]{escape(loading)}[/b]")
    elif stats is not None and stats.tokens:
        parts += [f"{stats.tok_per_s:.1f} tok/s", f"{stats.tokens_per_pass:.2f} tok/pass",
                  f"{stats.accepted_rate:.0%} accepted"]
    else:
        parts.append("ready")
    used = gpu if gpu is not None else rss
    if used is not None:
        label = "gpu" if gpu is not None else "mem"
        parts.append(f"{label} {format_bytes(used)}" + (f" / {format_bytes(budget)}" if budget else ""))
    info = info or {}
    model = info.get("model") or info.get("target")
    for key in (model, info.get("device"), info.get("dtype")):
        if key:
            parts.append(escape(str(key)))
    head = _head_text(info.get("head"))
    if head:
        parts.append(escape(head))
    return " · ".join(parts)


class StatusLine(Static):
    def refresh_status(self, *args: Any, **kwargs: Any) -> None:
        self.update(status_text(*args, **kwargs))
