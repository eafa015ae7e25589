"""Lookup in the user's own past answers: long continuations of whatever their text repeats.

Contract: `AnswerIndex(max_tokens)` holds the token ids of past answers, newest last, in one int32
array (answers separated by -1; at most `max_tokens`, the oldest answers dropped first) and, for every
place, the 3 tokens that end there as a sorted int64 key (last token in the high bits) with its int32
position: 16 bytes a token in all, so 10,000 answers of 256 tokens take 41 MB (`nbytes`). `add(ids)`
appends one answer (the sorted keys are rebuilt every 65k tokens added or dropped; what was added since
is scanned). `lookup(context, length, matches, min_match)` returns up to `matches` distinct
continuations of at most `length` tokens of the places that end like the context (at least
`min_match` tokens), longest match first, the newest answer first among equals
(assistant.runtime.lookup.continuations; `matches(...)` with the match lengths): places that share the
context's last 3 tokens first, then its last 2 or last 1 while fewer were found (one key range each);
`matches_at` gives each one's place too. `related(context)` is the start of the past answer that shares
the most 3-token runs with a prompt (asked again, or quoted), `near(context, center)` the continuations
of the places of one answer that end like the context, longest match first, then nearest `center`;
`answer_span(place)` the answer holding a place.
`HistoryDrafter(index)` is that lookup as a drafter (assistant.runtime.drafters' contract): it proposes
on a match of `min_match` tokens or more (1 by default, as the in-context lookup), and the ranking
(assistant.runtime.ranking) values each draft by how often matches of its length were accepted, so a
weak match takes tree nodes only when nothing likelier is on offer. It also follows one past answer:
the one the last match of `follow`+ tokens was in, else the one the prompt is about; where the text
left it for a few words, the places of that answer ahead (key "near") are where it picks up again,
which a 1-token match anywhere in the history ranks behind the newest places.

Why: prompt lookup copies from the current prompt and answer; one person's answers repeat across
conversations (the same boilerplate, the same phrasing of a kind of answer), which a lookup over
the profile's history banks from the first answer after it was written, without any training. A
lookup is a binary search in the sorted keys, so it costs about the same for 200 answers as for
10,000 (a scan of the whole array took 6 ms a pass at 10,000 answers on this CPU). Nothing is
persisted: the session rebuilds the index from history.sqlite at load (a sort of the keys).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from assistant.runtime.decode import DraftContext
from assistant.runtime.lookup import NEWEST, SEP, continuations_at, match_starts
from assistant.runtime.ranking import Draft, match_prior


NGRAM = 3              # the sorted index's key: the 3 tokens that end at a place
NEWEST_PLACES = 4096   # places of a short tail looked at (the newest)
RECENT_SCAN = 1 << 15  # tokens scanned first for a tail found at more than NEWEST_PLACES places
TAIL = 16              # tokens of a context that tell whether a later one extends it (HistoryDrafter)
MERGE = 1 << 16        # tokens added (or dropped) before the sorted index is rebuilt
_BITS = 21             # bits per token in a key (vocabularies up to 2M tokens; a larger id is still checked)
_MASK = (1 << _BITS) - 1


def _key(t0, t1, t2):
    """The sorted index's key of the 3 tokens t0 t1 t2 (ints, or int64 arrays of them) that end at a
    place: the LAST token in the high bits, so the places ending in a 1- or 2-token tail are one range."""
    return ((t2 & _MASK) << (2 * _BITS)) | ((t1 & _MASK) << _BITS) | (t0 & _MASK)


def _key_range(tail: Sequence[int]) -> tuple[int, int]:
    """The smallest and largest key of a place ending in `tail` (1 to 3 tokens)."""
    t = [int(x) for x in tail]
    free = NGRAM - len(t)
    lo = [0] * free + t
    hi = [_MASK] * free + t
    return _key(*lo), _key(*hi)


def _gram_keys(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keys, end positions) of every place of arr that is not a separator, sorted by key (stable, so
    by position within one key); tokens before the array's start count as separators."""
    a = np.concatenate([np.full(NGRAM - 1, SEP, dtype=np.int64), arr.astype(np.int64)])
    keys = _key(a[:-2], a[1:-1], a[2:])
    pos = np.flatnonzero(arr != SEP).astype(np.int32)
    keys = keys[pos]
    order = np.argsort(keys, kind="stable")
    return keys[order], pos[order]


class AnswerIndex:
    def __init__(self, max_tokens: int = 1_000_000):
        self.max_tokens = max(int(max_tokens), 0)
        self._arr = np.zeros(0, dtype=np.int32)
        self._seps = np.zeros(0, dtype=np.int64)       # where each answer ends (its SEP), ascending
        self._keys, self._pos = _gram_keys(self._arr)   # sorted 3-grams of the array when last rebuilt
        self._indexed = 0      # places (as of that rebuild) the sorted index covers
        self._dropped = 0      # tokens dropped from the front since then

    def _rebuild(self) -> None:
        self._keys, self._pos = _gram_keys(self._arr)
        self._indexed = int(self._arr.size)
        self._dropped = 0

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
            index._seps = np.flatnonzero(index._arr == SEP)
            index._rebuild()
        return index

    @classmethod
    def from_texts(cls, texts: Iterable[str], tokenizer, max_tokens: int = 1_000_000) -> "AnswerIndex":
        """An index of answer texts (oldest first), tokenized as the decode loop emits them (no special
        tokens): what a session and `bench --history` build from a profile's past answers."""
        return cls.from_answers((tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts), max_tokens)

    def __len__(self) -> int:
        return int(self._arr.size)

    @property
    def nbytes(self) -> int:
        """Memory held: the tokens (4 bytes each) and the sorted index (12 bytes a place)."""
        return int(self._arr.nbytes + self._keys.nbytes + self._pos.nbytes)

    @property
    def answers(self) -> int:
        """How many answers the index holds (each ends with one SEP)."""
        return int(self._seps.size)

    def add(self, ids: Sequence[int]) -> None:
        if not ids or len(ids) + 1 > self.max_tokens:
            return
        arr = np.concatenate([self._arr, np.asarray(list(ids) + [SEP], dtype=np.int32)])
        if arr.size > self.max_tokens:
            cut = arr.size - self.max_tokens
            seps = np.flatnonzero(arr == SEP)
            first = seps[np.searchsorted(seps, cut - 1)] + 1        # drop whole answers, oldest first
            arr = arr[first:]
            self._dropped += int(first)
        self._arr = arr
        self._seps = np.flatnonzero(arr == SEP)
        if arr.size - (self._indexed - self._dropped) > MERGE or self._dropped > MERGE:
            self._rebuild()

    def _starts(self, tail: Sequence[int]) -> np.ndarray:
        """Start positions of a 1- to 3-token tail (from the sorted index, plus a scan of what was
        added since); the newest `NEWEST_PLACES` when a short tail is everywhere."""
        n = len(tail)
        lo, hi = _key_range(tail)
        lo, hi = np.searchsorted(self._keys, lo, "left"), np.searchsorted(self._keys, hi, "right")
        if hi - lo > NEWEST_PLACES:        # a common tail: its newest places are in the newest text
            recent = match_starts(self._arr, tail, max(self._arr.size - RECENT_SCAN, 0))
            if recent.size >= NEWEST:
                return recent[-NEWEST:]
        ends = self._pos[lo:hi]
        if ends.size > NEWEST_PLACES:
            ends = ends[np.argpartition(ends, ends.size - NEWEST_PLACES)[-NEWEST_PLACES:]]
        old = ends.astype(np.int64) - self._dropped - (n - 1)
        new = match_starts(self._arr, tail, max(self._indexed - self._dropped - n + 1, 0))
        return np.concatenate([old[old >= 0], new])

    def lookup(self, context: Sequence[int], length: int = 16, matches: int = 2,
               min_match: int = 3) -> list[list[int]]:
        return [c for _, c in self.matches(context, length, matches, min_match)]

    def matches(self, context: Sequence[int], length: int = 16, matches: int = 2,
                min_match: int = 3) -> list[tuple[int, list[int]]]:
        """(match length, continuation) pairs, longest match first (assistant.runtime.lookup): the
        places ending in the context's last 3 tokens first, then, while fewer than `matches` were found,
        those ending in its last 2 and last 1 (down to `min_match`)."""
        return [(m, c) for m, c, _ in self.matches_at(context, length, matches, min_match)]

    def matches_at(self, context: Sequence[int], length: int = 16, matches: int = 2,
                   min_match: int = 3) -> list[tuple[int, list[int], int]]:
        """`matches`, each with the place in the index where its continuation starts (for `near`)."""
        if min_match < 1 or len(context) < min_match:
            return []
        found: dict[tuple[int, ...], tuple[int, int]] = {}
        for n in range(max(min_match, min(NGRAM, len(context))), min_match - 1, -1):
            g = min(n, NGRAM)
            starts = self._starts(context[-g:]) - (n - g)
            for m, c, at in continuations_at(self._arr, context, length, matches, n, starts, agree=True):
                found.setdefault(tuple(c), (m, at))
            if len(found) >= matches:
                break
        ranked = sorted(found.items(), key=lambda kv: -kv[1][0])[:matches]
        return [(m, list(c), at) for c, (m, at) in ranked]

    def near(self, context: Sequence[int], center: int, length: int = 16, matches: int = 2
             ) -> list[tuple[int, list[int], int]]:
        """Continuations of the places of the answer holding `center` that end in the context's last token:
        (match length, continuation, place), longest match first, then the nearest to `center`. Where an
        answer that the user's text has been following diverged for a few words, this is where it picks
        up again, which a 1-token match anywhere in the history does not single out."""
        arr = self._arr
        if not context or not 0 <= center < arr.size or arr[center] == SEP:
            return []
        lo, hi = self.answer_span(center)
        starts = np.flatnonzero(arr[lo: hi - 1] == int(context[-1])) + lo
        found = continuations_at(arr, context, length, NEWEST, 1, starts)
        found.sort(key=lambda x: (-x[0], abs(x[2] - center)))
        return found[:matches]

    def related(self, context: Sequence[int], min_shared: float = 4.0, tokens: int = 1024) -> int | None:
        """The first place of the past answer that shares the most 3-token runs with the context (the
        prompt that asks about it again, or quotes it), each run counted 1 / the number of answers that
        hold it (runs held by more than 64 places count nothing); None below `min_shared`."""
        ids = list(context[-tokens:])
        if self._arr.size == 0 or len(ids) < NGRAM:
            return None
        seps = self._seps
        votes: dict[int, float] = {}
        for g in {tuple(ids[i: i + NGRAM]) for i in range(len(ids) - NGRAM + 1)}:
            starts = self._starts(g)
            if starts.size == 0 or starts.size > NEWEST:
                continue
            held = np.unique(np.searchsorted(seps, starts))
            for a in held.tolist():
                votes[a] = votes.get(a, 0.0) + 1.0 / held.size
        if not votes:
            return None
        a, v = max(votes.items(), key=lambda kv: (kv[1], kv[0]))
        if v < min_shared:
            return None
        return int(seps[a - 1]) + 1 if a else 0

    def answer_span(self, place: int) -> tuple[int, int]:
        """[first, end) of the answer holding `place` (end: its separator)."""
        seps = self._seps
        k = int(np.searchsorted(seps, place))
        return (int(seps[k - 1]) + 1 if k else 0), (int(seps[k]) if k < seps.size else int(self._arr.size))


class HistoryDrafter:
    """Continuations from the user's past answers (AnswerIndex), on matches of `min_match`+ tokens, up to
    `matches` of them: 6, against the in-context lookup's 4, because a short tail has many more places in
    a user's past than in one conversation (token-only replays, lookups alone at 8 nodes: arena user
    +0.7%, code user +0.5%, French user -0.1% over 4; BENCHMARKS.md A18)."""

    feature_layers: tuple[int, ...] = (-1,)
    name = "history"

    def __init__(self, index: AnswerIndex, length: int = 16, matches: int = 6, min_match: int = 1,
                 follow: int = 3, near: int = 2):
        self.index, self.length, self.matches, self.min_match = index, length, matches, min_match
        self.follow, self.near = follow, near
        # the answer followed: (its place then, or -1 for none; the context's length then; its last tokens)
        self._anchor: tuple[int, int, tuple[int, ...]] | None = None

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        depth = max(1, min(self.length, ctx.max_nodes - 1))
        found = self.index.matches_at(ctx.ids, depth, self.matches, self.min_match)
        drafts = [Draft(c, ("history", min(m, 8)), match_prior(m, len(c))) for m, c, _ in found]
        if found and found[0][0] >= self.follow:
            self._anchor = (found[0][2], len(ctx.ids), tuple(ctx.ids[-TAIL:]))
        elif self.near and (center := self._center(ctx.ids)) is not None:
            near = [Draft(c, ("near", min(m, 8)), match_prior(m, len(c)))
                    for m, c, _ in self.index.near(ctx.ids, center, depth, self.near)]
            have = {tuple(d) for d in near}
            drafts = near + [d for d in drafts if tuple(d) not in have]
        return drafts

    def _center(self, ids: Sequence[int]) -> int | None:
        """Where the answer followed would be now, had the text gone on copying it (within that answer);
        in a new context (a new answer), the start of the past answer its prompt is about
        (AnswerIndex.related). None when there is none."""
        if self._anchor is not None:
            at, n, tail = self._anchor
            if len(ids) >= n and tuple(ids[n - len(tail): n]) == tail:
                return min(at + len(ids) - n, self.index.answer_span(at)[1] - 1) if at >= 0 else None
        at = self.index.related(ids)
        self._anchor = (-1 if at is None else at, len(ids), tuple(ids[-TAIL:]))
        return at

    def observe(self, tree, path: list[int]) -> None:
        pass


__all__ = ["AnswerIndex", "HistoryDrafter", "SEP"]
