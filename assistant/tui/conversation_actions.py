"""Conversation actions of the chat app: new, switch/resume, rename, delete, export, system prompt, copy.

Contract: `ConversationActions` is a mixin for `assistant.tui.app.ChatApp` (it uses the app's
`history`, `conv_id`, `pending_system_prompt`, `busy`, `banked`, `log_view`,
`prompt`, `show_error` and `_refresh_conversations`). Switching, new chat and
delete are refused with a hint while an answer is running or queued. Export
writes Markdown through a temp file and a rename, so a file is never half-written.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from assistant.tui.export import last_code_block, safe_filename, to_markdown
from assistant.tui.widgets.conversations import ConversationList
from assistant.tui.widgets.dialogs import ConfirmDialog, TextDialog
from assistant.tui.widgets.message import MessageView


class ConversationActions:
    """Mixin: the conversation-management key actions of ChatApp."""

    history: Any
    conv_id: int | None
    pending_system_prompt: str
    banked: bool

    def _refuse_while_busy(self, what: str) -> bool:
        if self.busy:
            self.notify(f"Stop the answer first (Esc), then {what}.", severity="warning")
            return True
        return False

    async def action_new_conversation(self) -> None:
        if self._refuse_while_busy("start a new chat"):
            return
        self.conv_id, self.pending_system_prompt = None, ""
        await self.log_view.remove_children()
        self._refresh_conversations()
        self.prompt.focus()

    async def open_conversation(self, conv_id: int) -> None:
        """Switch to a saved conversation and show its messages (resume it)."""
        if self._refuse_while_busy("switch chats"):
            return
        try:
            conv = self._conversation(conv_id)
            messages = list(self.history.messages(conv_id))
        except Exception as e:  # noqa: BLE001
            self.show_error(e, "opening the conversation")
            return
        self.conv_id = conv_id
        await self.log_view.remove_children()
        views = []
        if conv is not None and conv.system_prompt:
            views.append(MessageView("system", conv.system_prompt))
        for m in messages:
            note = "interrupted" if m.stats is not None and m.stats.finish == "interrupted" else ""
            views.append(MessageView(m.role, m.content, m.stats, banked=self.banked, note=note))
        await self.log_view.mount_all(views)
        self.log_view.scroll_end(animate=False)
        self._refresh_conversations()
        self.prompt.focus()

    async def on_conversation_list_picked(self, event: ConversationList.Picked) -> None:
        await self.open_conversation(event.conv_id)

    def action_copy_answer(self) -> None:
        texts = [v.text for v in self._assistant_views() if v.text]
        if not texts:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(texts[-1])
        self.notify("Copied the last answer.")

    def action_copy_code(self) -> None:
        for view in reversed(self._assistant_views()):
            code = last_code_block(view.text)
            if code is not None:
                self.copy_to_clipboard(code)
                self.notify("Copied the last code block.")
                return
        self.notify("No code block in the answers.", severity="warning")

    def action_rename_conversation(self) -> None:
        conv = self._conversation(self.conv_id)
        if conv is None:
            self.notify("Send a message first; new chats are named after it.", severity="warning")
            return

        def done(title: str | None) -> None:
            if title and title.strip():
                try:
                    self.history.rename_conversation(conv.id, title.strip())
                except Exception as e:  # noqa: BLE001
                    self.show_error(e, "renaming the conversation")
                self._refresh_conversations()

        self.push_screen(TextDialog("Rename this chat", conv.title), done)

    def action_system_prompt(self) -> None:
        conv = self._conversation(self.conv_id)
        current = conv.system_prompt if conv is not None else self.pending_system_prompt

        def done(text: str | None) -> None:
            if text is None:
                return
            if conv is None:
                self.pending_system_prompt = text
            else:
                try:
                    self.history.set_system_prompt(conv.id, text)
                except Exception as e:  # noqa: BLE001
                    self.show_error(e, "saving the system prompt")
                    return
            self.notify("System prompt set for this chat." if text else "System prompt cleared.")

        self.push_screen(TextDialog("System prompt for this chat", current,
                                    placeholder="e.g. You are a terse assistant."), done)

    def action_export_conversation(self) -> None:
        conv = self._conversation(self.conv_id)
        if conv is None:
            self.notify("Nothing to export yet.", severity="warning")
            return
        default = str(Path.cwd() / safe_filename(conv.title))

        def done(path: str | None) -> None:
            if not path:
                return
            try:
                target = self.export_conversation(conv.id, Path(path).expanduser())
            except Exception as e:  # noqa: BLE001
                self.show_error(e, "exporting")
                return
            self.notify(f"Exported to {target}")

        self.push_screen(TextDialog("Export this chat as Markdown to", default), done)

    def export_conversation(self, conv_id: int, path: Path) -> Path:
        """Write the conversation as Markdown (temp file + rename, never half-written)."""
        conv = self._conversation(conv_id)
        body = to_markdown(conv.title if conv else "Conversation", conv.system_prompt if conv else "",
                           [(m.role, m.content) for m in self.history.messages(conv_id)])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def action_delete_conversation(self) -> None:
        conv = self._conversation(self.conv_id)
        if conv is None:
            self.notify("No saved chat is open.", severity="warning")
            return
        if self._refuse_while_busy("delete this chat"):
            return

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.history.delete_conversation(conv.id)
            except Exception as e:  # noqa: BLE001
                self.show_error(e, "deleting the conversation")
                return
            self.conv_id = None
            await self.log_view.remove_children()
            self._refresh_conversations()
            self.notify(f"Deleted “{conv.title}”.")

        self.push_screen(ConfirmDialog(f"Delete the chat “{conv.title}”? This cannot be undone."), done)
