"""The conversation list (sidebar): pick one to switch to it and resume.

Contract: `ConversationList.show(conversations, current_id)` lists conversations
(most recent first, as the history returns them) and highlights the current one;
choosing an entry (Enter or click) posts `ConversationList.Picked(conv_id)`.
"""
from __future__ import annotations

from typing import Sequence

from rich.markup import escape
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Label, ListItem, ListView

from assistant.types import Conversation


class ConversationItem(ListItem):
    def __init__(self, conv: Conversation, current: bool) -> None:
        super().__init__(Label(("● " if current else "  ") + escape(conv.title or "untitled")))
        self.conv_id = conv.id


class ConversationList(Vertical):
    class Picked(Message):
        def __init__(self, conv_id: int) -> None:
            super().__init__()
            self.conv_id = conv_id

    def compose(self) -> ComposeResult:
        yield Label("Chats [dim](ctrl+n new)[/]", classes="panel-title")
        yield ListView(id="conversation-items")

    def show(self, conversations: Sequence[Conversation], current_id: int | None) -> None:
        lv = self.query_one(ListView)
        lv.clear()
        index = None
        for i, conv in enumerate(conversations):
            lv.append(ConversationItem(conv, conv.id == current_id))
            if conv.id == current_id:
                index = i
        if index is not None:
            lv.index = index

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, ConversationItem):
            self.post_message(self.Picked(event.item.conv_id))
