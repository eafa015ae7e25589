"""The multi-line prompt: Enter sends, Shift+Enter / Ctrl+J insert a new line.

Contract: `PromptInput` is a TextArea that posts `PromptInput.Submitted(text)`
when a send key (assistant.tui.keymap.PROMPT_SEND) is pressed with non-blank text, then
clears itself. New-line keys insert "\n"; pasted text is inserted verbatim, line
breaks kept. Escape is left to the app (it stops the answer). `restore(text)`
puts a prompt back (before whatever the user typed since).
"""
from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from assistant.tui.keymap import PROMPT_NEWLINE, PROMPT_SEND


class PromptInput(TextArea):
    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id, soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                         placeholder="Ask anything · Enter sends · Shift+Enter or Ctrl+J: new line")

    async def _on_key(self, event: events.Key) -> None:
        if event.key in PROMPT_SEND:
            event.stop()
            event.prevent_default()
            if self.text.strip():
                text = self.text
                self.clear()
                self.post_message(self.Submitted(text))
            return
        if event.key in PROMPT_NEWLINE:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)

    def restore(self, prompt: str) -> None:
        current = self.text
        self.load_text(prompt if not current.strip() else prompt.rstrip("\n") + "\n\n" + current)
        self.move_cursor(self.document.end)
        self.focus()
