"""The status line: load progress, then speed, speculation and memory numbers.

Contract: `status_text(..., width=)` (pure) formats one line from the session's `info()`
dict, the last answer's `AnswerStats`, and memory in use against the budget:
"23.4 tok/s · 2.31 tok/pass · 38% banked · mem 812.0 MiB / 8.0 GiB · compiled · 2t ·
bf16 · cpu · SmolLM2 · head …", most useful first; at `width` columns the head's
details go first, then whole parts from the end (the full head is in the adapter panel).
While the model loads it shows the stage and percent. `StatusLine.refresh_status`
renders it; the app calls it after each step and on a timer (memory).
"""
from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.text import Text
from textual.widgets import Static

from assistant.tui.stats import format_bytes
from assistant.types import AnswerStats


def _head_text(head: Any, long: bool = True) -> str:
    if not isinstance(head, dict) or not head:
        return ""
    name = head.get("name") or head.get("version") or head.get("head") or head.get("drafter") or "?"
    name = str(name)
    if "/" in name:
        name = name.rstrip("/").rsplit("/", 1)[-1]
    name = name.removesuffix(".safetensors")
    params = head.get("parameters") or head.get("params")
    rows = head.get("rows") or head.get("vocab_size")
    extra = []
    if long and params:
        extra.append(f"{int(params) / 1e6:.2f}M params" if int(params) >= 100_000 else f"{int(params)} params")
    if long and rows:
        extra.append(f"{rows} rows")
    return f"head {name}" + (f" ({', '.join(extra)})" if extra else "")


def _engine_text(info: dict[str, Any]) -> str:
    engine = info.get("engine")
    if not engine:
        return ""
    text = str(engine) + (" (compiled building)" if info.get("engine_building") else "")
    threads = info.get("threads")
    return text + (f" · {threads}t" if threads else "")


def status_text(info: dict[str, Any] | None, stats: AnswerStats | None, *, loading: str | None = None,
                rss: int | None = None, gpu: int | None = None, budget: int | None = None,
                width: int | None = None) -> str:
    """One line, most useful first; with `width` the parts that do not fit are left out (the head's
    details first, then whole parts from the end), never cut in the middle."""
    parts: list[str] = []
    if loading is not None:
        parts.append(f"[b]{escape(loading)}[/b]")
    elif stats is not None and stats.tokens:
        parts += [f"{stats.tok_per_s:.1f} tok/s", f"{stats.tokens_per_pass:.2f} tok/pass",
                  f"{stats.accepted_rate:.0%} banked"]
    else:
        parts.append("ready")
    used = gpu if gpu is not None else rss
    if used is not None:
        label = "gpu" if gpu is not None else "mem"
        parts.append(f"{label} {format_bytes(used)}" + (f" / {format_bytes(budget)}" if budget else ""))
    info = info or {}
    engine = _engine_text(info)
    if engine:
        parts.append(escape(engine))
    model = info.get("model") or info.get("target")
    for key in (info.get("dtype"), info.get("device"), model):     # short ones first: they fit more often
        if key:
            parts.append(escape(str(key)))
    head_long, head_short = _head_text(info.get("head")), _head_text(info.get("head"), long=False)
    if width is None:
        return " · ".join(parts + ([escape(head_long)] if head_long else []))
    sep = " · "
    for head in (head_long, head_short, ""):
        line = sep.join(parts + ([escape(head)] if head else []))
        if Text.from_markup(line).cell_len <= width:
            return line
    kept: list[str] = []
    for part in parts:
        if Text.from_markup(sep.join(kept + [part])).cell_len > width and kept:
            break
        kept.append(part)
    return sep.join(kept)


class StatusLine(Static):
    """Re-renders the last status to its own width on a resize."""

    _last: tuple[tuple, dict] = ((None, None), {})

    def refresh_status(self, *args: Any, **kwargs: Any) -> None:
        self._last = (args, kwargs)
        self.update(status_text(*args, **kwargs, width=self.size.width or None))

    def on_resize(self) -> None:
        args, kwargs = self._last
        self.update(status_text(*args, **kwargs, width=self.size.width or None))
