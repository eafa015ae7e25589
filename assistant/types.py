"""The conversation data model shared by the history store, `assistant ask` and the chat UI.

Contract: plain types, standard library only (never torch, never the store), so
assistant.tui may import this module at its own import. `Conversation` and `Message`
are what a history (profiles.history.HistoryStore, tui.history.MemoryHistory)
returns; `Message.stats` is the `AnswerStats` of an assistant answer (None for
other messages). `AnswerStats` is the one shape of an answer's decoding
statistics: `add(step)` accumulates one decoding step (a `StepLike`: tokens,
drafted tokens, seconds, one forward pass) and records the character span of the
step's text, marked "banked" when any of its tokens came from accepted
speculation (`step.drafted > 0`); `tok_per_s`, `tokens_per_pass` and
`accepted_rate` (drafted / total tokens) derive from it. `to_dict()` is the JSON
object stored with the message and `from_dict(d, text)` reads it back (spans that
do not fit `text` are dropped); nothing else writes or reads that object.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ROLES = ("system", "user", "assistant")


@runtime_checkable
class StepLike(Protocol):
    """One target forward pass worth of answer (assistant.runtime.decode.Step)."""

    text: str                 # text delta of the tokens committed by this pass
    tokens: list[int]         # tokens committed by this pass
    drafted: int              # how many of `tokens` (the first ones) came from accepted speculation
    finish: str | None        # None, "eos", "stop", "length" or "cancelled"
    seconds: float
    tree_size: int


@dataclass
class AnswerStats:
    tokens: int = 0
    drafted: int = 0
    passes: int = 0
    seconds: float = 0.0
    chars: int = 0
    finish: str | None = None     # a step's finish, or "interrupted" for an answer saved as the chat closed
    banked: list[tuple[int, int]] = field(default_factory=list)  # [start, end) char spans
    target: str | None = None     # what answered, when the writer knows it (assistant ask does)
    dtype: str | None = None
    head: str | None = None

    def add(self, step: StepLike) -> None:
        n = len(step.tokens)
        self.tokens += n
        self.drafted += min(max(int(step.drafted), 0), n)
        self.passes += 1
        self.seconds += float(step.seconds or 0.0)
        start, self.chars = self.chars, self.chars + len(step.text)
        if step.drafted > 0 and self.chars > start:
            if self.banked and self.banked[-1][1] == start:
                self.banked[-1] = (self.banked[-1][0], self.chars)
            else:
                self.banked.append((start, self.chars))
        if step.finish:
            self.finish = step.finish

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    @property
    def accepted_rate(self) -> float:
        return self.drafted / self.tokens if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens": self.tokens, "drafted": self.drafted, "passes": self.passes,
            "seconds": round(self.seconds, 4), "finish": self.finish,
            "tok_per_s": round(self.tok_per_s, 2), "tokens_per_pass": round(self.tokens_per_pass, 3),
            "banked": [list(s) for s in self.banked]}
        for key in ("target", "dtype", "head"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, text: str = "") -> "AnswerStats":
        d = d if isinstance(d, dict) else {}
        spans = []
        for s in d.get("banked") or []:
            try:
                a, b = int(s[0]), int(s[1])
            except (TypeError, ValueError, IndexError):
                continue
            if 0 <= a < b <= len(text):
                spans.append((a, b))
        return cls(tokens=int(d.get("tokens") or 0), drafted=int(d.get("drafted") or 0),
                   passes=int(d.get("passes") or 0), seconds=float(d.get("seconds") or 0.0),
                   chars=len(text), finish=d.get("finish"), banked=spans,
                   target=d.get("target"), dtype=d.get("dtype"), head=d.get("head"))


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    role: str                     # one of ROLES
    content: str
    accepted: bool
    stats: AnswerStats | None
    created: float
