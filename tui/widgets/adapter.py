"""The adapter panel: what the background adapter has done and is doing, in a few labelled lines.

Contract: `adapter_text(status, error, available=, busy=)` (pure) renders the status dict of
`adapt.status.status` (what `assistant adapt --status --json` prints, led by the chat's worker
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
    lines = ["[b]Adapter[/b] [dim](ctrl+r adapt now)[/]"]
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
    head = s.get("version") or "shipped"
    lines.append(_row("head", f"{head} · {rows:,} / {budget:,} rows" if isinstance(rows, int) and budget
                      else f"{head} · rows ?"))
    sched = s.get("schedule") or {}
    pending = s.get("pending")
    if not s.get("enabled", True):
        nxt = "adapter off"
    elif sched.get("min_new_answers"):
        nxt = f"next cycle at {sched['min_new_answers']}"
    else:
        nxt = ""
    lines.append(_row("pending", (f"{pending} answers" if pending is not None else "? answers")
                      + (f" · {nxt}" if nxt else "")))
    last = s.get("last_cycle") or {}
    if last:
        status_word = last.get("status", "?")
        t = last.get("tokens_per_pass") or {}
        what = f"{status_word} {_when(last.get('time'))}".strip()
        lines.append(_row("last", what, "green" if status_word == "published" else "yellow"))
        user, orig = _tpp(t.get("user_before"), t.get("user_after")), _tpp(t.get("anchor_before"), t.get("anchor_after"))
        if user or orig:
            lines.append(_row("", " · ".join(x for x in (f"you {user}" if user else "",
                                                          f"original {orig}" if orig else "") if x)
                              + " tok/pass"))
        for reason in (last.get("reasons") or [])[:2]:
            lines.append(_row("", reason, "yellow"))
    else:
        lines.append(_row("last", "no cycle yet"))
    running = (s.get("running") or {}).get("stage")
    worker = s.get("worker")
    if running or busy or (worker and not str(worker).startswith(("idle", "waiting", "stopped"))):
        lines.append(_row("now", running or (str(worker) if worker else "running a cycle…"), "cyan"))
    elif worker:
        lines.append(_row("worker", str(worker)))
    failure = (s.get("last_error") or {}).get("message") if isinstance(s.get("last_error"), dict) else None
    if failure:
        lines.append(_row("failed", str(failure).strip().splitlines()[0][:200], "red"))
    for problem in s.get("problems") or ([s["problem"]] if s.get("problem") else []):
        lines.append(_row("problem", str(problem), "red"))
    return "\n".join(lines)


class AdapterPanel(Static):
    def show(self, *args: Any, **kwargs: Any) -> None:
        self.update(adapter_text(*args, **kwargs))
