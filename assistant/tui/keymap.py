"""Every key binding of the chat UI, in one place.

Contract: `APP_BINDINGS` are the application-wide bindings (priority where the
prompt's TextArea would otherwise swallow the key); `PROMPT_SEND` / `PROMPT_NEWLINE`
are the keys the prompt widget handles itself. Each binding has an id so a user
keymap (`App.set_keymap`) can rebind it. `describe()` lists them for help text.
"""
from __future__ import annotations

from textual.binding import Binding

PROMPT_SEND: frozenset[str] = frozenset({"enter"})
PROMPT_NEWLINE: frozenset[str] = frozenset({"shift+enter", "ctrl+j"})

APP_BINDINGS: list[Binding] = [
    Binding("escape", "stop", "Stop", id="chat.stop"),
    Binding("ctrl+n", "new_conversation", "New chat", id="chat.new", priority=True),
    Binding("ctrl+b", "toggle_sidebar", "Chats", id="chat.sidebar", priority=True),
    Binding("ctrl+t", "toggle_banked", "Banked", id="chat.banked", priority=True),
    Binding("ctrl+o", "copy_answer", "Copy answer", id="chat.copy_answer", priority=True),
    Binding("ctrl+g", "copy_code", "Copy code", id="chat.copy_code", priority=True),
    Binding("f2", "rename_conversation", "Rename", id="chat.rename"),
    Binding("f3", "system_prompt", "System prompt", id="chat.system_prompt"),
    Binding("f4", "export_conversation", "Export", id="chat.export"),
    Binding("f8", "delete_conversation", "Delete", id="chat.delete"),
    Binding("ctrl+r", "adapter_cycle", "Adapt now", id="chat.adapt", priority=True),
    Binding("ctrl+q", "quit", "Quit", id="chat.quit", priority=True),
    Binding("ctrl+c", "quit", "Quit", id="chat.quit_c", priority=True, show=False),
]


def describe() -> list[tuple[str, str]]:
    """(keys, description) for every binding, prompt keys included."""
    rows = [("enter", "Send"), ("shift+enter / ctrl+j", "New line")]
    rows += [(b.key, b.description) for b in APP_BINDINGS if b.description]
    return rows
