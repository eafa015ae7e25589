"""Incremental detokenisation and stop conditions, applied token by token.

Contract: `TextStream.push(token)` returns the text that token adds to the
answer (possibly "" while a multi-byte character is incomplete) and whether the
answer must stop after it (EOS, a stop string completed, or max_new_tokens),
exactly where greedy decoding would stop: the stopping token is kept, nothing
after it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TextStream:
    tokenizer: Any
    eos_ids: set[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: str | None = None

    def push(self, token: int) -> str:
        """Append one generated token; return its text delta. Sets `finish` when the answer ends."""
        if self.finish is not None:
            raise RuntimeError("push after the answer finished")
        self.ids.append(int(token))
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        delta = ""
        if not full.endswith("\ufffd"):
            delta = full[len(self.text):]
            self.text = full
        if int(token) in self.eos_ids:
            self.finish = "eos"
        elif self.stop_strings and any(s in full[-(len(s) + len(delta) + 8):] for s in self.stop_strings):
            self.finish = "stop"
        elif len(self.ids) >= self.max_new_tokens:
            self.finish = "length"
        return delta

    def flush(self) -> str:
        """Text held back for an incomplete character, at the end of the answer."""
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        delta = full[len(self.text):]
        self.text = full
        return delta
