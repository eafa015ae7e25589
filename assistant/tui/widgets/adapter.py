"""The adapter panel: what the background adapter has done and is doing, in a few labelled lines.

Contract: `adapter_text(status, error, available=, busy=)` (pure) renders the status dict of
`assistant.adapt.status.status` (what `assistant adapt --status --json` prints, led by the chat's worker
"worker" line when one runs) as: the head version and rows against the row budget, accepted
answers pending and when the next cycle starts, the last cycle (when; published or rejected and
why; tokens per pass before -> after on the user's answers and on the original data), what runs
now with its progress ("finetune step 300/1200"), the worker's failure and every problem in one
line each. When there is no adapter source it says "adapter: not available".
`AdapterPanel.show(...)` displays it; the app polls the source in a thread worker and runs a
cycle on ctrl+r.
"""
from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from textual.widgets import Static

NOT_AVAILABLE = "adapter: not available"


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)) or t <= 0:
        return ""
    age = time.time() - t
    if age < 90:
        return "just now"
    if age < 5400:
        return f"{age / 60:.0f} min ago"
    if age < 36 * 3600:
        return f"{age / 3600:.0f} h ago"
    return time.strftime("%Y-%m-%d", time.localtime(t))


def _tpp(before: Any, after: Any) -> str:
    if before is None or after is None:
        return ""
    return f"{before:.2f} → {after:.2f}"


def _row(label: str, text: str, style: str = "") -> str:
    body = escape(text)
    return f"[dim]{label:<8}[/] " + (f"[{style}]{body}[/]" if style else body)


def adapter_text(status: dict[str, Any] | None, error: str | None = None, *, available: bool = True,
                 busy: bool = False) -> str:
    """Short labelled lines (the panel is a narrow sidebar: ~18 columns after the label)."""
    lines = ["[b]Adapter[/b] [dim](ctrl+r now)[/]"]
    if not available:
        return lines[0] + "\n" + NOT_AVAILABLE
    if error:
        lines.append(_row("error", error, "red"))
    if status is None:
        if not error:
            lines.append("no status yet")
        return "\n".join(lines)
    s = status
    rows, budget = s.get("rows"), s.get("row_budget")
    lines.append(_row("head", s.get("version") or "shipped"))
    lines.append(_row("rows", f"{rows:,} / {budget:,}" if isinstance(rows, int) and budget else "?"))
    sched = s.get("schedule") or {}
    pending = s.get("pending")
    nxt = "off" if not s.get("enabled", True) else (f"cycle at {sched['min_new_answers']}"
                                                     if sched.get("min_new_answers") else "")
    lines.append(_row("pending", (str(pending) if pending is not None else "?") + (f" · {nxt}" if nxt else "")))
    last = s.get("last_cycle") or {}
    if last:
        word = last.get("status", "?")
        lines.append(_row("last", f"{word} {_when(last.get('time'))}".strip(),
                          "green" if word == "published" else "yellow"))
        t = last.get("tokens_per_pass") or {}
        for label, a, b in (("you", "user_before", "user_after"), ("original", "anchor_before", "anchor_after")):
            if _tpp(t.get(a), t.get(b)):
                lines.append(_row(label, _tpp(t.get(a), t.get(b))))
        for reason in (last.get("reasons") or [])[:2]:
            lines.append(_row("why", reason, "yellow"))
    else:
        lines.append(_row("last", "no cycle yet"))
    running = (s.get("running") or {}).get("stage")
    worker = str(s.get("worker") or "")
    if running or busy or worker.startswith("running"):
        lines.append(_row("now", running or worker.removeprefix("running").strip(" ()") or "a cycle…", "cyan"))
    elif worker and worker != "failed":
        lines.append(_row("worker", worker))
    err = s.get("last_error")
    failure = err.get("message") if isinstance(err, dict) else None
    if failure or worker == "failed":
        lines.append(_row("failed", str(failure or "see the log").strip().splitlines()[0][:200], "red"))
    for problem in s.get("problems") or ([s["problem"]] if s.get("problem") else []):
        lines.append(_row("problem", str(problem), "red"))
    return "\n".join(lines)


class AdapterPanel(Static):
    def show(self, *args: Any, **kwargs: Any) -> None:
        self.update(adapter_text(*args, **kwargs))
