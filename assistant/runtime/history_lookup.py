"""Lookup in the user's own past answers: long continuations of whatever their text repeats.

Contract: `AnswerIndex(max_tokens)` holds the token ids of past answers, newest last, in one int32
array (answers separated by -1; at most `max_tokens`, the oldest answers dropped first: 4 bytes a
token, so 10,000 answers of 256 tokens take 10 MB). `add(ids)` appends one answer. `lookup(context,
length, matches, min_match)` returns up to `matches` distinct continuations of at most `length`
tokens of the places that end like the context (at least `min_match` tokens), longest match first,
the newest answer first among equals (assistant.runtime.lookup.continuations; `matches(...)` with
the match lengths).
`HistoryDrafter(index)` is that lookup as a drafter (assistant.runtime.drafters' contract): it proposes
only on a match of `min_match` tokens or more, so text the user never wrote costs the tree nothing.

Why: prompt lookup copies from the current prompt and answer; one person's answers repeat across
conversations (the same boilerplate, the same phrasing of a kind of answer), which a lookup over
the profile's history banks from the first answer after it was written, without any training. The
scan is vectorised over the array: ~1 ms a pass for 500k tokens on this CPU, microseconds for the
few thousand tokens of a typical profile.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from assistant.runtime.decode import DraftContext
from assistant.runtime.lookup import SEP, continuations
from assistant.runtime.ranking import Draft, match_prior


class AnswerIndex:
    def __init__(self, max_tokens: int = 1_000_000):
        self.max_tokens = max(int(max_tokens), 0)
        self._arr = np.zeros(0, dtype=np.int32)

    @classmethod
    def from_answers(cls, answers: Iterable[Sequence[int]], max_tokens: int = 1_000_000) -> "AnswerIndex":
        """An index of `answers` (oldest first); only the newest that fit in `max_tokens` are kept."""
        kept: list[Sequence[int]] = []
        total = 0
        for ids in reversed(list(answers)):
            if not ids:
                continue
            if total + len(ids) + 1 > max_tokens:
                break
            kept.append(ids)
            total += len(ids) + 1
        index = cls(max_tokens)
        if kept:
            parts = [np.asarray(list(ids) + [SEP], dtype=np.int32) for ids in reversed(kept)]
            index._arr = np.concatenate(parts)
        return index

    def __len__(self) -> int:
        return int(self._arr.size)

    @property
    def answers(self) -> int:
        """How many answers the index holds (each ends with one SEP)."""
        return int(np.count_nonzero(self._arr == SEP))

    def add(self, ids: Sequence[int]) -> None:
        if not ids or len(ids) + 1 > self.max_tokens:
            return
        arr = np.concatenate([self._arr, np.asarray(list(ids) + [SEP], dtype=np.int32)])
        if arr.size > self.max_tokens:
            cut = arr.size - self.max_tokens
            seps = np.flatnonzero(arr == SEP)
            first = seps[np.searchsorted(seps, cut - 1)] + 1        # drop whole answers, oldest first
            arr = arr[first:]
        self._arr = arr

    def lookup(self, context: Sequence[int], length: int = 16, matches: int = 2,
               min_match: int = 3) -> list[list[int]]:
        return [c for _, c in self.matches(context, length, matches, min_match)]

    def matches(self, context: Sequence[int], length: int = 16, matches: int = 2,
                min_match: int = 3) -> list[tuple[int, list[int]]]:
        """(match length, continuation) pairs, longest match first (assistant.runtime.lookup)."""
        return continuations(self._arr, context, length, matches, min_match)


class HistoryDrafter:
    """Continuations from the user's past answers (AnswerIndex), on matches of `min_match`+ tokens."""

    feature_layers: tuple[int, ...] = (-1,)
    name = "history"

    def __init__(self, index: AnswerIndex, length: int = 16, matches: int = 2, min_match: int = 3):
        self.index, self.length, self.matches, self.min_match = index, length, matches, min_match

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        depth = max(1, min(self.length, ctx.max_nodes - 1))
        return [Draft(c, ("history", min(m, 8)), match_prior(m, len(c)))
                for m, c in self.index.matches(ctx.ids, depth, self.matches, self.min_match)]

    def observe(self, tree, path: list[int]) -> None:
        pass


__all__ = ["AnswerIndex", "HistoryDrafter", "SEP"]
