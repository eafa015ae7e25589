"""The error banner: what went wrong and what to do, never a traceback.

Contract: `ErrorBanner.show_problem(problem)` displays a `assistant.tui.errors.Problem`
(title, detail, action) and makes the banner visible; `clear()` hides it.
`problem` holds the one on display (None when hidden), for tests and callers.
"""
from __future__ import annotations

from rich.markup import escape
from textual.widgets import Static

from assistant.tui.errors import Problem


class ErrorBanner(Static):
    problem: Problem | None = None

    def on_mount(self) -> None:
        self.display = self.problem is not None

    def show_problem(self, problem: Problem) -> None:
        self.problem = problem
        detail = f": {escape(problem.detail)}" if problem.detail else ""
        self.update(f"[b]✗ {escape(problem.title)}[/b]{detail}\n→ {escape(problem.action)}")
        self.display = True

    def clear(self) -> None:
        self.problem = None
        self.update("")
        self.display = False
