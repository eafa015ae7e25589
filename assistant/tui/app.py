"""`ChatApp`: the Textual chat UI over a Session, a conversation history and an adapter.

Contract: `ChatApp(session, history=..., adapter=..., memory_budget=...)` never
imports torch itself: `session.load` and `session.answer` run in thread workers
(`load_model`, `_generate`, exclusive per group) and touch widgets only through
`call_from_thread`, one call per decoding step. Prompts sent while the model
loads (or while an answer streams) are queued and answered in order. Esc stops
the answer at once: the shown text stays (marked stopped, not saved) and the
prompt goes back into the input. A finished answer is saved with its user
message (accepted, with its statistics and banked spans); on quit, unfinished
turns are saved as they are. Errors (and `startup_errors` found before the UI
started) are shown in the banner with what to do (assistant.tui.errors); tracebacks go to
`log_path`, never to the screen. A send after a failed load retries the load.
The app is layout, model loading and sending; answering (tui/answering.py), the
adapter panel (tui/adapter_actions.py) and conversation management
(tui/conversation_actions.py) are its mixins.
"""
from __future__ import annotations

import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from textual import on, work
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Footer, Header, ProgressBar

from assistant.tui.adapter_actions import AdapterActions
from assistant.tui.answering import Answering, Turn
from assistant.tui.conversation_actions import ConversationActions
from assistant.tui.errors import Problem, explain, format_traceback
from assistant.tui.export import title_from_prompt
from assistant.tui.history import MemoryHistory
from assistant.tui.keymap import APP_BINDINGS
from assistant.tui.protocol import AdapterStatusSource, HistoryLike, SessionLike
from assistant.tui.stats import gpu_bytes, parse_bytes, rss_bytes
from assistant.tui.widgets.adapter import AdapterPanel
from assistant.tui.widgets.conversations import ConversationList
from assistant.tui.widgets.message import MessageView
from assistant.tui.widgets.notice import ErrorBanner
from assistant.tui.widgets.prompt import PromptInput
from assistant.tui.widgets.status import StatusLine
from assistant.types import AnswerStats, Conversation


class ChatApp(Answering, AdapterActions, ConversationActions, App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "assistant"
    BINDINGS = APP_BINDINGS

    def __init__(self, session: SessionLike, *, history: HistoryLike | None = None,
                 adapter: AdapterStatusSource | None = None, memory_budget: int | str | None = None,
                 profile_name: str | None = None, log_path: str | Path | None = None,
                 autoload: bool = True, poll_seconds: float = 2.0, show_clock: bool = False,
                 startup_errors: list[tuple[BaseException, str]] | None = None,
                 memory_probe: Callable[[], int | None] | None = None) -> None:
        super().__init__()
        self.session = session
        self.history: HistoryLike = history if history is not None else MemoryHistory()
        self.adapter = adapter
        self.memory_budget = parse_bytes(memory_budget)
        self.log_path = Path(log_path) if log_path else Path(tempfile.gettempdir()) / "assistant-chat.log"
        self.autoload = autoload
        self.poll_seconds = poll_seconds
        self.sub_title = f"profile {profile_name}" if profile_name else ""
        self.conv_id: int | None = None
        self.pending_system_prompt = ""
        self.ready = False
        self.load_failed = False
        self.loading: str | None = "starting"
        self.info_cache: dict[str, Any] = {}
        self.last_stats: AnswerStats | None = None
        self.banked = False
        self.queue: deque[Turn] = deque()
        self.active: Turn | None = None
        self.adapter_status: dict[str, Any] | None = None
        self.adapter_busy = False
        self._gen_lock = threading.Lock()
        self._show_clock = show_clock
        self._startup_errors = list(startup_errors or [])
        self._memory_probe = memory_probe

    # --- layout ------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=self._show_clock, icon="◆")
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield ConversationList(id="conversations")
                yield AdapterPanel(id="adapter")
            with Vertical(id="chat-pane"):
                yield ErrorBanner(id="error")
                yield VerticalScroll(id="chat-log")
                yield ProgressBar(total=100, show_eta=False, id="load-progress")
                yield PromptInput(id="prompt")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#chat-log", VerticalScroll).anchor()
        self._refresh_conversations()
        self._refresh_adapter()
        self.query_one(PromptInput).focus()
        self._refresh_status()
        for exc, during in self._startup_errors:
            self.show_error(exc, during)
        if self.poll_seconds > 0:
            self.set_interval(self.poll_seconds, self._refresh_status)
            if self.adapter is not None:
                self.set_interval(self.poll_seconds, self._poll_adapter)
        if self.adapter is not None:
            self._poll_adapter()
        if self.autoload:
            self.load_model()

    # --- helpers -----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.active is not None or bool(self.queue)

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#chat-log", VerticalScroll)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    def _from_thread(self, fn: Any, *args: Any) -> Any:
        """call_from_thread that is silent once the app has gone away."""
        try:
            return self.call_from_thread(fn, *args)
        except RuntimeError:
            return None

    def show_error(self, exc: BaseException | Problem, during: str = "") -> Problem:
        if isinstance(exc, BaseException):
            self._log_exception(exc, during)
            problem = explain(exc, during)
        else:
            problem = exc
        self.query_one(ErrorBanner).show_problem(problem)
        return problem

    def _log_exception(self, exc: BaseException, during: str = "") -> None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {during}\n{format_traceback(exc)}\n")
        except OSError:
            pass

    def _fatal_error(self) -> None:
        """A bug in a handler: log the traceback, print one line on exit, never a traceback."""
        exc = self._exception
        if exc is not None:
            self._log_exception(exc, "fatal")
        try:
            self._save_unfinished()
        except Exception:  # noqa: BLE001 - already failing; the log has the first error
            pass
        self._exit_renderables.append(
            f"assistant chat stopped on an unexpected error ({type(exc).__name__}: {exc}); "
            f"details in {self.log_path}. Your conversation so far is saved.")
        self._close_messages_no_wait()

    def _refresh_status(self) -> None:
        loading = None
        if not self.ready:
            loading = self.loading if self.loading is not None else "model not loaded"
        self.query_one(StatusLine).refresh_status(self.info_cache, self.last_stats, loading=loading,
                                                  rss=self._memory_probe() if self._memory_probe else rss_bytes(),
                                                  gpu=None if self._memory_probe else gpu_bytes(),
                                                  budget=self.memory_budget)

    def _refresh_conversations(self) -> None:
        try:
            convs = list(self.history.list_conversations())
        except Exception as e:  # noqa: BLE001 - history errors are shown, not raised
            self.show_error(e, "reading the history")
            convs = []
        self.query_one(ConversationList).show(convs, self.conv_id)

    def _conversation(self, conv_id: int | None) -> Conversation | None:
        if conv_id is None:
            return None
        return next((c for c in self.history.list_conversations() if c.id == conv_id), None)

    def _assistant_views(self) -> list[MessageView]:
        return [v for v in self.log_view.query(MessageView) if v.role == "assistant"]

    # --- model loading -----------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_model(self) -> None:
        def progress(stage: str, fraction: float | None) -> None:
            self._from_thread(self._on_progress, stage, fraction)

        self._from_thread(self._on_progress, "loading the model", None)
        try:
            self.session.load(progress)
            info = self.session.info()
        except Exception as e:  # noqa: BLE001 - shown in the UI
            self._from_thread(self._on_load_failed, e)
            return
        self._from_thread(self._on_loaded, info)

    def _on_progress(self, stage: str, fraction: float | None) -> None:
        self.loading = stage + (f" {fraction:.0%}" if fraction is not None and fraction < 1 else "")
        bar = self.query_one("#load-progress", ProgressBar)
        bar.update(total=None if fraction is None else 100, progress=(fraction or 0) * 100)
        self._refresh_status()

    def _on_loaded(self, info: dict[str, Any]) -> None:
        self.ready, self.loading, self.info_cache = True, None, dict(info)
        self.query_one("#load-progress", ProgressBar).display = False
        self._refresh_status()
        self._pump()

    def _on_load_failed(self, exc: Exception) -> None:
        self.loading, self.load_failed = "model not loaded (send to retry)", True
        self.query_one("#load-progress", ProgressBar).display = False
        self.show_error(exc, "loading the model")
        self._refresh_status()
        waiting = list(self.queue)
        self.queue.clear()
        for turn in reversed(waiting):
            turn.state = "failed"
            turn.answer_view.set_note("not answered: the model did not load (your prompt is back in the input)")
            self.prompt.restore(turn.prompt)

    # --- sending ---------------------------------------------------------------------------
    def _ensure_conversation(self, prompt: str) -> int:
        if self.conv_id is None:
            self.conv_id = self.history.new_conversation(title_from_prompt(prompt), self.pending_system_prompt)
            self.pending_system_prompt = ""
            self._refresh_conversations()
        return self.conv_id

    @on(PromptInput.Submitted)
    async def _on_submit(self, event: PromptInput.Submitted) -> None:
        try:
            conv_id = self._ensure_conversation(event.text)
        except Exception as e:  # noqa: BLE001
            self.show_error(e, "saving the conversation")
            self.prompt.restore(event.text)
            return
        user = MessageView("user", event.text)
        note = "" if self.ready else "queued: answers when the model has loaded"
        answer = MessageView("assistant", banked=self.banked, note=note)
        await self.log_view.mount_all([user, answer])
        self.log_view.scroll_end(animate=False)
        self.queue.append(Turn(event.text, conv_id, user, answer))
        if self.load_failed:           # try again: the user may have fixed what the banner said
            self.load_failed = False
            self.query_one("#load-progress", ProgressBar).display = True
            self.load_model()
        self._pump()

    # --- actions -----------------------------------------------------------------------------
    async def action_quit(self) -> None:
        self._save_unfinished()
        self.exit(0)

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display
        if sidebar.display:
            self.query_one("#conversation-items").focus()
        else:
            self.prompt.focus()

    def action_toggle_banked(self) -> None:
        self.banked = not self.banked
        for view in self._assistant_views():
            view.set_banked(self.banked)
        self.notify("Banked view on: highlighted text was drafted (phrase head or lookup) and accepted"
                    if self.banked else "Banked view off", timeout=3)
