"""The adapter panel: the background adapter's status, the same data as `assistant adapt --status`.

Contract: `adapter_text(status, error)` (pure) renders a status dict (scalars as
"key: value", nested dicts one level deep, lists by length) or, when there is no
adapter source, "adapter: not available". `AdapterPanel.show(...)` displays it;
the app polls the source in a thread worker and runs a cycle on ctrl+r.
"""
from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual.widgets import Static

NOT_AVAILABLE = "adapter: not available"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, tuple)):
        return f"{len(v)} items"
    if isinstance(v, dict):
        return f"{len(v)} fields"
    return str(v)


def adapter_text(status: dict[str, Any] | None, error: str | None = None, *, available: bool = True,
                 busy: bool = False, max_lines: int = 14) -> str:
    lines = ["[b]Adapter[/b] [dim](ctrl+r adapt now)[/]"]
    if not available:
        return lines[0] + "\n" + NOT_AVAILABLE
    if busy:
        lines.append("[yellow]running a cycle…[/]")
    if error:
        lines.append(f"[red]{escape(error)}[/]")
    if status is None:
        lines.append("no status yet" if not error else "")
    else:
        for k, v in status.items():
            if isinstance(v, dict):
                lines.append(f"{escape(str(k))}:")
                lines += [f"  {escape(str(k2))}: {escape(_fmt(v2))}" for k2, v2 in list(v.items())[:6]]
            else:
                lines.append(f"{escape(str(k))}: {escape(_fmt(v))}")
    return "\n".join(lines[:max_lines]).rstrip()


class AdapterPanel(Static):
    def show(self, *args: Any, **kwargs: Any) -> None:
        self.update(adapter_text(*args, **kwargs))
