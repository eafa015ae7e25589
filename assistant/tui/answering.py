"""Answering in the chat app: the queue of turns, the thread worker that streams an answer, stop, save.

Contract: `Answering` is a mixin for `assistant.tui.app.ChatApp` (it uses the app's
`session`, `history`, `ready`, `queue`, `active`, `last_stats`, `prompt`,
`show_error`, `_conversation`, `_from_thread`, `_refresh_status` and
`_refresh_conversations`). `_pump()` starts the next queued `Turn` once the model
is ready and none is running; `_generate` runs `session.answer` in a thread worker
(one answer at a time on the model, also against an adapter's head swap, through
`_gen_lock`) and hands each step to the UI with one `call_from_thread`. A finished
answer is saved with its user message, accepted unless it was cut, with its
`AnswerStats`; Esc (`action_stop`) stops the running answer at once (the shown
text stays, marked stopped, not saved) or takes back the last queued prompt;
`_save_unfinished` saves every unsaved turn as far as it got (finish
"interrupted"), for quitting.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from textual import work
from textual.worker import get_current_worker

from assistant.tui.protocol import ChatMessage, SessionLike
from assistant.tui.widgets.message import MessageView
from assistant.tui.widgets.notice import ErrorBanner
from assistant.types import AnswerStats, StepLike

FINISH_NOTES = {
    "length": "cut at max_new_tokens: ask it to continue, or raise max_new_tokens in profile.toml",
    "cancelled": "stopped",
}


@dataclass
class Turn:
    """One prompt and its answer, from submit to saved."""

    prompt: str
    conv_id: int
    user_view: MessageView
    answer_view: MessageView
    state: str = "queued"                 # queued | running | done | stopped | failed
    saved: bool = False
    cancel: threading.Event = field(default_factory=threading.Event)


class Answering:
    """Mixin: the answer queue of ChatApp and its bridge to the session's thread."""

    session: SessionLike
    history: Any
    ready: bool
    queue: deque[Turn]
    active: Turn | None
    last_stats: AnswerStats | None
    _gen_lock: threading.Lock

    def _messages_for(self, turn: Turn) -> list[ChatMessage]:
        conv = self._conversation(turn.conv_id)
        msgs: list[ChatMessage] = []
        if conv is not None and conv.system_prompt:
            msgs.append({"role": "system", "content": conv.system_prompt})
        for m in self.history.messages(turn.conv_id):
            if m.role in ("user", "assistant", "system") and m.content:
                if m.role == "system" and msgs and msgs[0]["role"] == "system":
                    continue
                msgs.append({"role": m.role, "content": m.content})
        msgs.append({"role": "user", "content": turn.prompt})
        return msgs

    def _pump(self) -> None:
        if not self.ready or self.active is not None or not self.queue:
            return
        turn = self.queue.popleft()
        try:
            messages = self._messages_for(turn)
        except Exception as e:  # noqa: BLE001
            turn.state = "failed"
            turn.answer_view.set_note("not answered (see the error above)")
            self.show_error(e, "reading the history")
            self._pump()
            return
        self.active, turn.state = turn, "running"
        turn.answer_view.set_note("")
        self._generate(turn, messages)

    @work(thread=True, exclusive=True, group="answer", exit_on_error=False)
    def _generate(self, turn: Turn, messages: list[ChatMessage]) -> None:
        worker = get_current_worker()

        def cancelled() -> bool:
            return worker.is_cancelled or turn.cancel.is_set()

        with self._gen_lock:     # one answer at a time on the model, even right after a stop
            if cancelled():
                return
            try:
                for step in self.session.answer(messages, cancelled):
                    if cancelled():
                        break
                    self._from_thread(self._on_step, turn, step)
                    if step.finish:
                        break
            except Exception as e:  # noqa: BLE001 - shown in the UI
                self._from_thread(self._on_answer_failed, turn, e)
                return
        self._from_thread(self._on_answer_done, turn)

    async def _on_step(self, turn: Turn, step: StepLike) -> None:
        if turn.state != "running":
            return
        await turn.answer_view.append(step)
        self.last_stats = turn.answer_view.stats
        self._refresh_status()

    async def _on_answer_done(self, turn: Turn) -> None:
        if turn.state != "running":
            return
        turn.state = "done"
        finish = turn.answer_view.stats.finish
        await turn.answer_view.finish(FINISH_NOTES.get(finish or "", ""))
        self._save(turn, accepted=finish in (None, "eos", "stop"))
        self.active = None
        self._refresh_status()
        self._pump()

    async def _on_answer_failed(self, turn: Turn, exc: Exception) -> None:
        if turn.state == "running":
            turn.state = "failed"
            await turn.answer_view.finish("not answered (see the error above); your prompt is back in the input")
            self.prompt.restore(turn.prompt)
            self.active = None
        self.show_error(exc, "answering")
        self._pump()

    def _save(self, turn: Turn, accepted: bool, finish: str | None = None) -> None:
        if turn.saved:
            return
        turn.saved = True
        stats = turn.answer_view.stats
        if finish:
            stats = replace(stats, finish=finish)
        try:
            self.history.add_message(turn.conv_id, "user", turn.prompt)
            if turn.answer_view.text:
                self.history.add_message(turn.conv_id, "assistant", turn.answer_view.text,
                                         accepted=accepted, stats=stats)
        except Exception as e:  # noqa: BLE001
            self.show_error(e, "saving the conversation")
        self._refresh_conversations()

    async def action_stop(self) -> None:
        turn = self.active
        if turn is not None and turn.state == "running":
            turn.state = "stopped"
            turn.cancel.set()
            self.workers.cancel_group(self, "answer")
            self.active = None
            await turn.answer_view.finish("stopped: your prompt is back in the input")
            self.prompt.restore(turn.prompt)
            self._pump()
        elif self.queue:
            turn = self.queue.pop()
            turn.state = "stopped"
            await turn.user_view.remove()
            await turn.answer_view.remove()
            self.prompt.restore(turn.prompt)
        else:
            self.query_one(ErrorBanner).clear()

    def _save_unfinished(self) -> None:
        """Stop generating and save every turn not yet saved, as far as it got."""
        for turn in ([self.active] if self.active else []) + list(self.queue):
            turn.cancel.set()
            self._save(turn, accepted=False, finish="interrupted")
        self.active = None
        self.queue.clear()
        self.workers.cancel_group(self, "answer")
