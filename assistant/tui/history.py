"""An in-memory conversation store with the profile history API.

Contract: `MemoryHistory` implements `assistant.tui.protocol.HistoryLike` exactly as the
profile's history.sqlite store does (ids from 1, `list_conversations()` most
recently updated first, `messages()` in insertion order, the data model of
assistant.types, a message's stats kept as the store keeps them: through
`AnswerStats.to_dict()` and `from_dict`), but keeps nothing after the process
exits. The app uses it when it is given no profile history, and tests use it as
the reference fake.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any

from assistant.types import AnswerStats, Conversation, Message


@dataclass
class MemoryHistory:
    _convs: dict[int, Conversation] = field(default_factory=dict)
    _msgs: dict[int, Message] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _clock: Any = field(default_factory=lambda: itertools.count(1))

    def _now(self) -> float:
        return time.time() + next(self._clock) * 1e-6   # strictly increasing

    def _conv(self, conv_id: int) -> Conversation:
        if conv_id not in self._convs:
            raise KeyError(f"no conversation {conv_id}")
        return self._convs[conv_id]

    def new_conversation(self, title: str, system_prompt: str = "") -> int:
        cid, now = next(self._ids), self._now()
        self._convs[cid] = Conversation(cid, title, system_prompt, now, now)
        return cid

    def list_conversations(self) -> list[Conversation]:
        return sorted(self._convs.values(), key=lambda c: c.updated, reverse=True)

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self._convs[conv_id] = replace(self._conv(conv_id), title=title, updated=self._now())

    def delete_conversation(self, conv_id: int) -> None:
        self._conv(conv_id)
        del self._convs[conv_id]
        self._msgs = {k: m for k, m in self._msgs.items() if m.conversation_id != conv_id}

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        self._convs[conv_id] = replace(self._conv(conv_id), system_prompt=text, updated=self._now())

    def add_message(self, conv_id: int, role: str, content: str, accepted: bool = False,
                    stats: AnswerStats | None = None) -> int:
        conv = self._conv(conv_id)
        mid, now = next(self._ids), self._now()
        kept = None if stats is None else AnswerStats.from_dict(stats.to_dict(), content)
        self._msgs[mid] = Message(mid, conv_id, role, content, accepted, kept, now)
        self._convs[conv_id] = replace(conv, updated=now)
        return mid

    def messages(self, conv_id: int) -> list[Message]:
        self._conv(conv_id)
        return [m for m in self._msgs.values() if m.conversation_id == conv_id]

    def mark_accepted(self, msg_id: int) -> None:
        self._msgs[msg_id] = replace(self._msgs[msg_id], accepted=True)
