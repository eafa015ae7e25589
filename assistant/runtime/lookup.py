"""n-gram lookup over a token array: the continuations of earlier places that end like the context.

Contract: `continuations(arr, context, length, matches, min_match)` finds the places where the
context's last `min_match` tokens occur in `arr` (int32, -1 separates documents and never matches),
measures each match backwards (up to `MAX_MATCH` tokens), and returns up to `matches` distinct
`(match_length, continuation)` pairs of at most `length` tokens each: longest match first; among
equal matches, the newest place (highest index) first, or with `agree` the continuation that more
of the places with a match at least as long agree on (over its first `AGREE_DEPTH` tokens: the
frequency of SuffixDecoding's suffix tree), then the newest. A place whose continuation would start past the end
of `arr` is no match, so the context itself can be `arr` (prompt lookup) without finding its own tail.

`match_starts(arr, tail)` is the vectorised scan; an index that knows the places passes them as
`starts` instead (assistant.runtime.history_lookup keeps its 3-grams sorted).

Used by the in-context lookup (assistant.runtime.drafters.PromptLookupDrafter) and the lookup in a
profile's past answers (assistant.runtime.history_lookup); the scan and the backward extension are
vectorised, ~0.1 ms on a few thousand tokens here.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

SEP = -1
MAX_MATCH = 16
NEWEST = 64        # places measured at most (the newest)
AGREE_DEPTH = 4    # tokens of a continuation over which the places' agreement is counted


def match_starts(arr: np.ndarray, tail: Sequence[int], lo: int = 0) -> np.ndarray:
    """Positions s >= lo, ascending, where arr[s : s + len(tail)] == tail and arr[s + len(tail)] exists."""
    n = len(tail)
    if arr.size - lo <= n:
        return np.zeros(0, dtype=np.int64)
    t = np.asarray(tail, dtype=np.int32)
    hit = arr[lo: arr.size - n] == t[0]
    for k in range(1, n):
        hit &= arr[lo + k: arr.size - n + k] == t[k]
    return np.flatnonzero(hit) + lo


def continuations(arr: np.ndarray, context: Sequence[int], length: int, matches: int,
                  min_match: int, starts: np.ndarray | None = None, agree: bool = False
                  ) -> list[tuple[int, list[int]]]:
    """See the module contract. `starts`: the match places of the context's last `min_match` tokens when
    an index already knows them (any order, checked here), instead of scanning `arr`. `agree`: among
    equal matches, the continuation most places agree on first (else the newest)."""
    return [(m, c) for m, c, _ in continuations_at(arr, context, length, matches, min_match, starts, agree)]


def continuations_at(arr: np.ndarray, context: Sequence[int], length: int, matches: int,
                     min_match: int, starts: np.ndarray | None = None, agree: bool = False
                     ) -> list[tuple[int, list[int], int]]:
    """`continuations`, each with the index in `arr` where its continuation starts."""
    n = min_match
    if n < 1 or len(context) < n or arr.size <= n or length < 1 or matches < 1:
        return []
    tail = list(context[-n:])
    if starts is None:
        starts = match_starts(arr, tail)
    else:
        starts = np.unique(starts[(starts >= 0) & (starts < arr.size - n)])
        ok = np.ones(starts.size, dtype=bool)
        for k in range(n):
            ok &= arr[starts + k] == tail[k]
        starts = starts[ok]
    starts = starts[::-1][:NEWEST]                   # arr[s:s+n] == tail, arr[s+n] continues it; newest first
    if starts.size == 0:
        return []
    ctx = np.asarray(context, dtype=np.int32)
    m = np.full(starts.size, n)
    alive = np.ones(starts.size, dtype=bool)
    for k in range(1, min(MAX_MATCH - n, len(ctx) - n) + 1):
        before = starts - k
        ok = alive & (before >= 0)
        ok[ok] = arr[before[ok]] == ctx[-n - k]
        if not ok.any():
            break
        m += ok
        alive = ok
    conts: list[tuple[int, ...]] = []
    for s in starts.tolist():
        cont = arr[s + n: s + n + length]
        stop = np.flatnonzero(cont == SEP)
        conts.append(tuple(cont[: stop[0]].tolist() if stop.size else cont.tolist()))
    best: dict[tuple[int, ...], tuple] = {}
    votes: dict[tuple[int, ...], int] = {}
    for level in sorted(set(m.tolist()), reverse=True):
        here = [i for i in range(len(conts)) if m[i] == level]          # newest first
        for i in here if agree else ():       # how many places with a match this long or longer agree
            for d in range(1, min(len(conts[i]), AGREE_DEPTH) + 1):
                votes[conts[i][:d]] = votes.get(conts[i][:d], 0) + 1
        for i in here:
            c = conts[i]
            if c and c not in best:
                best[c] = (-level, *(-votes[c[:d]] for d in range(1, min(len(c), AGREE_DEPTH) + 1) if agree), i)
    ranked = sorted(best, key=best.get)[:matches]
    return [(-best[c][0], list(c), int(starts[best[c][-1]]) + n) for c in ranked]

__all__ = ["MAX_MATCH", "SEP", "continuations", "continuations_at", "match_starts"]
