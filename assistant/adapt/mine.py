"""Phrase mining under a row budget, and the phrase-chain table.

Contract (pure Python on token-id sequences; no model, no torch except for
`chain_table`'s output):
- `word_starts(table)` marks target tokens that start a word (their bytes begin
  with a space, tab or newline).
- `candidate_spans(seqs, starts, config)` counts every token span of 1..max_tokens
  tokens that covers at most `max_words` words (a span may begin mid-word, as a
  phrase follows any pending token; it ends where the next token starts a word or
  the sequence ends, so a row never stops inside a word, except single tokens).
- `mine(seqs, table, budget, existing=None, config)` picks up to `budget` NEW rows
  (token tuples, best first) scored by the tokens they would bank when a perfect
  head proposes the longest matching row after every pending token (decode
  order: row, then the bonus token). It refines the choice by re-simulating
  with the chosen rows `config.rounds` times. Rows already in `existing` (a
  DraftVocab) count as present and are not returned again.
- `longest_match(seq, i, index, max_len)` -> length of the longest row matching seq[i:].
- `chain_table(seqs, vocab, width, with_probs)` -> Long [capacity, width]: for each
  row, the rows that most often follow it directly (longest match after longest
  match; -1 = none), and with `with_probs` their conditional frequencies.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class MineConfig:
    max_words: int = 3
    max_tokens: int = 10
    min_count: int = 2          # spans seen fewer times are not rows (single tokens excepted)
    rounds: int = 3             # re-simulation rounds
    pool_factor: float = 3.0    # candidate pool = budget * pool_factor, by count * length


def word_starts(table) -> list[bool]:
    """Per target token id: does it begin a word (leading space, tab or newline)?"""
    return [bool(b) and b[:1] in (b" ", b"\n", b"\t") for b in table.id_bytes]


def _starts_word(tok: int, starts: Sequence[bool]) -> bool:
    return tok < len(starts) and starts[tok]


def candidate_spans(seqs: Iterable[Sequence[int]], starts: Sequence[bool], config: MineConfig = MineConfig()) -> Counter:
    """Counter of token tuples (see module docstring)."""
    counts: Counter = Counter()
    for seq in seqs:
        n = len(seq)
        for i in range(n):
            words = 1
            for j in range(i + 1, min(i + config.max_tokens, n) + 1):
                # span seq[i:j]; a new word begins at j-1 when j-1 > i and that token starts a word
                if j - 1 > i and _starts_word(seq[j - 1], starts):
                    words += 1
                    if words > config.max_words:
                        break
                ends_word = j == n or _starts_word(seq[j], starts)
                if j - i == 1 or ends_word:
                    counts[tuple(seq[i:j])] += 1
    return counts


def longest_match(seq: Sequence[int], i: int, index, max_len: int) -> int:
    """Length of the longest row (a key of `index`) equal to seq[i:i+len]; 0 if none."""
    for n in range(min(max_len, len(seq) - i), 0, -1):
        if tuple(seq[i:i + n]) in index:
            return n
    return 0


def simulate(seqs: Iterable[Sequence[int]], rows: set, max_len: int) -> tuple[Counter, int, int]:
    """Perfect-head decode: per pass, the longest row after the pending token, then the bonus.

    Returns (tokens banked per row, total tokens, passes).
    """
    banked: Counter = Counter()
    tokens = passes = 0
    for seq in seqs:
        i = 0                    # seq[i] is the pending (root) token
        n = len(seq)
        tokens += n
        passes += 1              # the prefill produces seq[0]
        while i < n - 1:
            L = longest_match(seq, i + 1, rows, max_len)
            if L:
                banked[tuple(seq[i + 1:i + 1 + L])] += L
            i += L + 1
            passes += 1
    return banked, tokens, passes


def mine(seqs: Sequence[Sequence[int]], table, budget: int, existing=None,
         config: MineConfig = MineConfig()) -> list[tuple[int, ...]]:
    """Up to `budget` new rows, best first (see module docstring)."""
    if budget <= 0:
        return []
    starts = word_starts(table)
    counts = candidate_spans(seqs, starts, config)
    have = set(existing._index) if existing is not None else set()
    pool = [(c * len(s), s) for s, c in counts.items()
            if s not in have and (c >= config.min_count or len(s) == 1)]
    pool.sort(reverse=True)
    pool = [s for _, s in pool[: int(budget * config.pool_factor) + 1]]
    chosen = pool[:budget]
    tried = set(chosen)
    for _ in range(config.rounds):
        rows = have | set(chosen)
        max_len = max((len(r) for r in rows), default=1)
        banked, _, _ = simulate(seqs, rows, max_len)
        # keep rows that banked tokens, ranked by it; refill with untried pool entries
        kept = sorted((r for r in chosen if banked[r] > 0), key=lambda r: -banked[r])
        refill = []
        for s in pool:
            if len(kept) + len(refill) >= budget:
                break
            if s not in tried:
                refill.append(s)
                tried.add(s)
        if not refill and len(kept) == len(chosen):
            chosen = kept
            break
        chosen = kept + refill
    return chosen[:budget]


def segment(seq: Sequence[int], index, max_len: int, start: int = 0) -> list[tuple[int, ...]]:
    """Greedy longest-match segmentation of seq[start:] into rows; unmatched tokens are skipped."""
    out, i = [], start
    while i < len(seq):
        L = longest_match(seq, i, index, max_len)
        if L == 0:
            out.append(())
            i += 1
            continue
        out.append(tuple(seq[i:i + L]))
        i += L
    return out


def chain_table(seqs: Iterable[Sequence[int]], vocab, width: int = 4, with_probs: bool = False):
    """Long [capacity, width]: most frequent rows that directly follow each row (-1 = none).

    Counted at every position: the longest row at i, then the longest row right after it.
    With `with_probs`, also Float [capacity, width]: P(next row | row) of each entry.
    """
    import torch

    index = vocab._index
    max_len = max((len(t) for t in index), default=1)
    follow: dict[int, Counter] = defaultdict(Counter)
    for seq in seqs:
        n = len(seq)
        match = [longest_match(seq, i, index, max_len) for i in range(n)]
        for i in range(n):
            L = match[i]
            if not L or i + L >= n or not match[i + L]:
                continue
            a = index[tuple(seq[i:i + L])]
            b = index[tuple(seq[i + L:i + L + match[i + L]])]
            follow[a][b] += 1
    out = torch.full((max(vocab.capacity, 1), width), -1, dtype=torch.long)
    probs = torch.zeros((max(vocab.capacity, 1), width))
    for a, c in follow.items():
        common = c.most_common(width)
        total = sum(c.values())
        out[a, : len(common)] = torch.tensor([b for b, _ in common])
        probs[a, : len(common)] = torch.tensor([n / total for _, n in common])
    return (out, probs) if with_probs else out


def coverage(seqs: Sequence[Sequence[int]], rows: set) -> dict[str, float]:
    """Perfect-head tokens per pass for one phrase per pass (an upper bound for the head)."""
    max_len = max((len(r) for r in rows), default=1)
    _, tokens, passes = simulate(seqs, rows, max_len)
    return {"tokens": tokens, "passes": passes, "tokens_per_pass": tokens / max(passes, 1)}
