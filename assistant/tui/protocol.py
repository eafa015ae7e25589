"""What the terminal UI needs from the rest of the system, as structural protocols.

Contract: tui/ imports nothing of ours at module import except the plain data model
(assistant.types: Conversation, Message, AnswerStats, StepLike); the app is handed
objects that satisfy these protocols. `SessionLike` matches `assistant.session.Session`
(load / answer / info / swap_head) and yields `StepLike`s (assistant.runtime.decode.Step),
`HistoryLike` matches the profile history store (`profiles.Profile.history`), and
`AdapterStatusSource` is how the adapter panel reads the same data as
`assistant adapt --status` and runs one cycle now. Every method of a session may
block (torch work) and is only ever called from a thread worker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

from assistant.types import AnswerStats, Conversation, Message, StepLike

Progress = Callable[[str, "float | None"], None]
ChatMessage = dict[str, str]          # {"role": "user"|"assistant"|"system", "content": ...}


@runtime_checkable
class SessionLike(Protocol):
    def load(self, progress: Progress | None = None) -> None: ...

    def answer(self, messages: list[ChatMessage],
               cancel: Callable[[], bool] | None = None) -> Iterator[StepLike]: ...

    def info(self) -> dict[str, Any]: ...

    def swap_head(self, path: Any) -> dict[str, Any]: ...


class HistoryLike(Protocol):
    def new_conversation(self, title: str, system_prompt: str = "") -> int: ...

    def list_conversations(self) -> Sequence[Conversation]: ...

    def rename_conversation(self, conv_id: int, title: str) -> None: ...

    def delete_conversation(self, conv_id: int) -> None: ...

    def set_system_prompt(self, conv_id: int, text: str) -> None: ...

    def add_message(self, conv_id: int, role: str, content: str, accepted: bool = False,
                    stats: AnswerStats | None = None) -> int: ...

    def messages(self, conv_id: int) -> Sequence[Message]: ...

    def mark_accepted(self, msg_id: int) -> None: ...


class AdapterStatusSource(Protocol):
    """The adapter as the UI sees it: a status snapshot and 'run one cycle now'."""

    def status(self) -> dict[str, Any] | None: ...

    def run_once(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class AdapterHooks:
    """An AdapterStatusSource made of two plain callables (what the CLI wires in)."""

    status_fn: Callable[[], "dict[str, Any] | None"]
    run_once_fn: Callable[[], "dict[str, Any] | None"] | None = None

    def status(self) -> dict[str, Any] | None:
        return self.status_fn()

    def run_once(self) -> dict[str, Any] | None:
        if self.run_once_fn is None:
            raise RuntimeError("this build cannot run an adapter cycle from the UI")
        return self.run_once_fn()
